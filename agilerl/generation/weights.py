"""The trainer's weights as a generation engine loads them: whole tensors, Hugging Face names.

One place for what every weight-synced backend (vLLM colocated or served) needs:

- under FSDP2 each weight is a sharded ``DTensor``: it is gathered whole (``full_tensor``), a
  collective every rank enters in the same order, so every rank's engine gets the full weights;
- with LoRA (peft) the engine gets the **merged** weights (``W + scale * B @ A``, computed
  without touching the trained module), under the base model's names; adapters are never sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["hf_weights"]


def hf_weights(model: Any) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every weight of ``model`` (a Hugging Face model or a peft model
    around one), whole and detached, LoRA merged in."""
    import torch

    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    deltas = _lora_deltas(base)
    out = []
    with torch.no_grad():
        for key, tensor in base.state_dict().items():
            if "lora_" in key or ".original_module." in key:
                continue
            name = key.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")
            tensor = _whole(tensor)
            if name in deltas:
                tensor = tensor + deltas[name].to(tensor.dtype)
            out.append((name, tensor.detach()))
    return out


def _lora_deltas(base: Any) -> dict[str, torch.Tensor]:
    """``{weight name: scale * B @ A}`` summed over each LoRA layer's active adapters."""
    import torch

    deltas: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, module in base.named_modules():
            lora_a = getattr(module, "lora_A", None)
            if lora_a is None or not hasattr(module, "get_delta_weight") or getattr(module, "merged", False):
                continue
            for adapter in getattr(module, "active_adapters", []):
                if adapter in lora_a:
                    delta = _whole(module.get_delta_weight(adapter))
                    key = f"{name}.weight"
                    deltas[key] = deltas[key] + delta if key in deltas else delta
    return deltas


def _whole(tensor: Any) -> Any:
    """A sharded ``DTensor`` gathered whole; any other tensor as it is."""
    full = getattr(tensor, "full_tensor", None)
    return full() if callable(full) else tensor
