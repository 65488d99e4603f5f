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


def _group_batch():
    """Two prompts (5 and 3 tokens), each with three different continuations, right-padded."""
    torch.manual_seed(1)
    prompts = [torch.randint(10, 400, (5,)), torch.randint(10, 400, (3,))]
    rows, masks = [], []
    for p in prompts:
        for length in (4, 6, 2):
            rows.append(torch.cat([p, torch.randint(10, 400, (length,))]))
            masks.append([False] * len(p) + [True] * length)
    width = max(len(r) for r in rows)
    input_ids = torch.zeros((len(rows), width), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    mask = torch.zeros_like(input_ids, dtype=torch.bool)
    for i, (row, m) in enumerate(zip(rows, masks)):
        input_ids[i, : len(row)], attention_mask[i, : len(row)] = row, 1
        mask[i, : len(m)] = torch.tensor(m)
    return input_ids, attention_mask, mask


def test_a_shared_prompt_runs_once_and_gives_the_same_logprobs_and_gradients(tiny_model):
    input_ids, attention_mask, mask = _group_batch()
    calls = []
    hook = tiny_model.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    tiny_model.train()
    try:
        tiny_model.zero_grad()
        shared = policy_logprobs(tiny_model, input_ids, attention_mask, mask=mask)
        (shared * mask).sum().backward()
        shared_grads = {n: p.grad.clone() for n, p in tiny_model.named_parameters() if p.grad is not None}
        tiny_model.zero_grad()
        plain = policy_logprobs(tiny_model, input_ids, attention_mask)  # no mask: every row whole
        (plain * mask).sum().backward()
        plain_grads = {n: p.grad.clone() for n, p in tiny_model.named_parameters() if p.grad is not None}
    finally:
        hook.remove()
        tiny_model.zero_grad()
        tiny_model.eval()
    # the common unscored start is 2 tokens (the short prompt's first 2): each distinct one once
    assert calls[0] == (2, 2) and calls[1] == (6, input_ids.shape[1] - 2)
    assert torch.allclose(shared[mask], plain[mask], atol=1e-5)
    assert shared_grads.keys() == plain_grads.keys() and shared_grads
    for name, grad in plain_grads.items():
        assert torch.allclose(shared_grads[name], grad, atol=1e-5, rtol=1e-4), name


def test_rows_with_no_prefix_in_common_run_in_one_pass(tiny_model):
    input_ids, attention_mask, mask = _group_batch()
    input_ids[:, 0] = torch.arange(len(input_ids)) + 10  # every row starts differently
    calls = []
    hook = tiny_model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        with torch.no_grad():
            policy_logprobs(tiny_model, input_ids, attention_mask, mask=mask)
    finally:
        hook.remove()
    assert len(calls) == 1
