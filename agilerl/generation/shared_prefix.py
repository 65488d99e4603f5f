"""One forward pass for a prefix that many rows share: a GRPO group's prompt, a DPO pair's.

GRPO asks for ``group`` completions of each prompt, so a batch holds every prompt ``group``
times over; DPO holds each prompt twice. Run as is, the model computes each copy of the prompt
again, in generation (the prefill) and in training (forward and backward). Here each distinct
prefix runs once and its KV cache is indexed out to every row that has it; with gradients on,
autograd sums what each copy contributes, so the gradient is the one the full batch gives.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["shared_prefix_cache"]


_CACHE_ARGUMENTS = ("cache", "past_key_values")  # the second is transformers 4's name


def _forward_parameters(model: Any) -> Any:
    """What ``model.forward`` takes; for a wrapper that passes keywords on (DDP, peft), what the
    model inside it takes. A wrapper with a forward of its own (PPO's value head) takes no cache."""
    parameters = inspect.signature(model.forward).parameters
    if any(name in parameters for name in _CACHE_ARGUMENTS):
        return parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        inner = getattr(model, "module", None)  # DDP
        if inner is None and callable(getattr(model, "get_base_model", None)):  # peft
            inner = model.get_base_model()
        if inner is not None and inner is not model:
            return _forward_parameters(inner)
    return parameters


def shared_prefix_cache(model: Any, input_ids: Any, attention_mask: Any, length: int) -> dict[str, Any]:
    """The keyword argument handing ``model`` a cache of ``input_ids[:, :length]`` for every row,
    each distinct prefix computed once; empty when no prefix repeats or the model takes no cache.

    Rows may be left-padded (generation): positions are numbered as ``generate`` numbers them.
    """
    import torch

    accepts = _forward_parameters(model) if length > 0 else {}
    name = next((n for n in _CACHE_ARGUMENTS if n in accepts), None)
    if name is None:
        return {}
    masked = input_ids[:, :length].masked_fill(attention_mask[:, :length] == 0, -1)  # padding is no token
    prefixes = [tuple(row) for row in masked.tolist()]
    first_row: dict[tuple[int, ...], int] = {}
    for row, prefix in enumerate(prefixes):
        first_row.setdefault(prefix, row)
    if len(first_row) == len(prefixes):
        return {}
    from transformers import DynamicCache

    unique = torch.tensor(list(first_row.values()), device=input_ids.device)
    mask = attention_mask[unique, :length]
    cache = DynamicCache()
    model(
        input_ids=input_ids[unique, :length], attention_mask=mask,
        position_ids=(mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1), use_cache=True,
        **{name: cache}, **({"logits_to_keep": 1} if "logits_to_keep" in accepts else {}),
    )
    if cache.get_seq_length() != length:  # the model kept no cache (gradient checkpointing turns it off)
        return {}
    slot = {prefix: u for u, prefix in enumerate(first_row)}
    cache.batch_select_indices(torch.tensor([slot[p] for p in prefixes], device=input_ids.device))
    return {name: cache}
