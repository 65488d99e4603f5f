"""Generation backends: what turns the trainer's model into a :class:`Policy` for collection.

A backend is a registered factory (``register_generation_backends``), named by a manifest's
``generation.backend``; the built-ins are ``transformers`` (the trainer's own module generates:
nothing to sync) and ``vllm`` (an engine with its own copy of the weights). A third party
publishes an SGLang or llama.cpp backend the same way:

    def my_backend(model, tokenizer, *, max_model_len, seed, **options) -> Policy: ...

A policy that holds its own copy of the weights implements :class:`WeightSyncedPolicy`: the
trainer pushes the full weights into it after every optimiser step, before the next collection.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agilerl.errors import InvalidArgument
from agilerl.generation.policy import Policy, TransformersPolicy

if TYPE_CHECKING:
    import torch

__all__ = ["WeightSyncedPolicy", "transformers_backend", "build_generation"]


@runtime_checkable
class WeightSyncedPolicy(Policy, Protocol):
    """A policy generating from its own copy of the weights (vLLM, a server): the trainer calls
    ``load_weights`` with the full, Hugging Face-named weights after each optimiser step, and
    ``sleep`` before it (where the backend can free its memory for the update; a no-op elsewhere)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the weights generation uses; the next ``generate`` follows them."""
        ...

    def sleep(self) -> None:
        """Free what the optimiser step needs (GPU memory); ``load_weights`` wakes it."""
        ...


def transformers_backend(
    model: Any, tokenizer: Any, *, max_model_len: int | None = None, seed: int = 0, **options: Any
) -> TransformersPolicy:
    """The default backend: Hugging Face ``generate`` on the trainer's own module (no options)."""
    if options:
        raise InvalidArgument(
            f"generation: the transformers backend takes no options, got {sorted(options)}; "
            "remove them or set generation.backend to one that takes them (agilerl plugins list --all)."
        )
    return TransformersPolicy(model, tokenizer, max_model_len=max_model_len)


def build_generation(
    backend: str, model: Any, tokenizer: Any, *, max_model_len: int | None, seed: int, options: dict[str, Any]
) -> Policy:
    """The policy the registered ``backend`` builds for ``model``."""
    from agilerl.registry import resolve

    return resolve("backend", backend)(model, tokenizer, max_model_len=max_model_len, seed=seed, **options)
