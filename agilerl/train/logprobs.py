"""Token log-probabilities of a causal LM, aligned with the tokens they score, and their means."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agilerl.generation.shared_prefix import shared_prefix_cache

if TYPE_CHECKING:
    import torch

__all__ = ["token_logprobs", "logits_to_keep", "policy_logprobs", "forward", "masked_mean"]


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, *, temperature: float = 1.0
) -> torch.Tensor:
    """``out[b, t] = log p(input_ids[b, t] | input_ids[b, :t])``; 0 where nothing was scored.

    Aligned with ``input_ids`` so one mask (action, response) selects both tokens and scores.
    ``logits`` may cover only the last K positions (a model run with ``logits_to_keep=K``):
    earlier positions then score 0. ``temperature`` must match the sampler's so that on-policy
    importance ratios are exactly 1.
    """
    import torch

    kept = logits.shape[1]
    scaled = logits[:, :-1].float() / temperature
    targets = input_ids[:, input_ids.shape[1] - kept + 1 :].unsqueeze(-1)
    picked = scaled.gather(-1, targets).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
    return torch.nn.functional.pad(picked, (input_ids.shape[1] - kept + 1, 0))


def logits_to_keep(mask: torch.Tensor) -> int:
    """How many final positions' logits score every token ``mask`` selects (0: all of them).

    The vocabulary projection and log-softmax dominate a small model's step; prompts need neither.
    """
    selected = mask.any(dim=0).nonzero()
    if len(selected) == 0:
        return 1
    keep = mask.shape[1] - int(selected[0]) + 1
    return 0 if keep >= mask.shape[1] else keep


def policy_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,
    media: Any = None,
) -> torch.Tensor:
    """Run ``model`` over a right-padded batch and return :func:`token_logprobs` ``[B, T]``.

    With ``mask`` only the positions it selects are scored (the rest are 0), which skips the
    vocabulary projection over prompts.
    """
    logits = forward(model, input_ids, attention_mask, mask, media=media).logits
    return token_logprobs(logits, input_ids, temperature=temperature)


def forward(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    media: Any = None,
) -> Any:
    """The model's forward output, with logits only for what ``mask`` needs scored.

    The rows' common unscored start (a GRPO group's prompt, a DPO pair's) runs once per distinct
    prefix (:mod:`agilerl.generation.shared_prefix`); the logits then cover the rest of the rows.
    ``media`` (a batch's ``BatchMedia``) adds the rows' images (``pixel_values``, ...).
    """
    keep = logits_to_keep(mask) if mask is not None and _takes_logits_to_keep(model) else 0
    if media is not None:  # images (``BatchMedia``): every row runs whole, with its pixels
        extra = {"logits_to_keep": keep} if keep else {}
        return model(**media.model_inputs(input_ids), attention_mask=attention_mask, **extra)
    if keep:
        prefix = input_ids.shape[1] - keep  # right-padded: every row's first ``prefix`` tokens are real
        cache = shared_prefix_cache(model, input_ids, attention_mask, prefix)
        if cache:
            return model(input_ids=input_ids[:, prefix:], attention_mask=attention_mask, **cache)
        return model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep)
    return model(input_ids=input_ids, attention_mask=attention_mask)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is true; 0 (not NaN) when nothing is selected."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def _takes_logits_to_keep(model: torch.nn.Module) -> bool:
    """transformers' causal LMs (and wrappers passing keywords on) accept ``logits_to_keep``."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "logits_to_keep" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
