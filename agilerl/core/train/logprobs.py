"""Token log-probabilities of a causal LM, aligned with the tokens they score, and their means."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, *, temperature: float = 1.0
) -> torch.Tensor:
    """``out[b, t] = log p(input_ids[b, t] | input_ids[b, :t])``; position 0 has no prefix: 0.

    Aligned with ``input_ids`` so one mask (action, response) selects both tokens and scores.
    ``temperature`` must match the sampler's so that on-policy importance ratios are exactly 1.
    """
    import torch

    scaled = logits[:, :-1].float() / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    picked = scaled.gather(-1, targets).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
    return torch.nn.functional.pad(picked, (1, 0))


def policy_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Run ``model`` over a right-padded batch and return :func:`token_logprobs` ``[B, T]``."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    return token_logprobs(logits, input_ids, temperature=temperature)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is true; 0 (not NaN) when nothing is selected."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)
