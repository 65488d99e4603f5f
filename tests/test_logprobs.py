"""Scoring only the masked positions gives the same log-probs as scoring everything."""

from __future__ import annotations

import torch

from agilerl.train.logprobs import logits_to_keep, policy_logprobs


def test_trimmed_logits_score_the_masked_tokens_exactly(tiny_model):
    torch.manual_seed(0)
    input_ids = torch.randint(10, 400, (3, 12))
    attention_mask = torch.ones_like(input_ids)
    mask = torch.zeros_like(input_ids, dtype=torch.bool)
    mask[0, 7:10] = True
    mask[2, 5:12] = True
    assert logits_to_keep(mask) == 8  # positions 4..11: the logit before the first masked token on
    with torch.no_grad():
        full = policy_logprobs(tiny_model, input_ids, attention_mask)
        trimmed = policy_logprobs(tiny_model, input_ids, attention_mask, mask=mask)
    assert torch.allclose(full[mask], trimmed[mask], atol=1e-5)
    assert (trimmed[:, :5] == 0).all() and (full[:, 1:5] != 0).all()


def test_keep_is_zero_when_everything_is_needed_and_one_when_nothing_is():
    mask = torch.zeros(2, 6, dtype=torch.bool)
    assert logits_to_keep(mask) == 1
    mask[1, 1] = True
    assert logits_to_keep(mask) == 0
