"""TransformersPolicy on the tiny offline model: stops, padding, context limit, log-probs."""

from __future__ import annotations

import pytest
import torch

from agilerl.generation.policy import (
    Policy,
    SamplingParams,
    ScriptedPolicy,
    TransformersPolicy,
)
from agilerl.train.logprobs import token_logprobs


@pytest.fixture(scope="module")
def prompts(chatml_tokenizer):
    texts = ["hello world, guess a number", "hi"]
    rendered = [
        chatml_tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
        for t in texts
    ]
    return [chatml_tokenizer.encode(text, add_special_tokens=False) for text in rendered]


def greedy(policy, prompts, **kwargs):
    return policy.generate(prompts, SamplingParams(temperature=0, **kwargs))


def test_both_policies_satisfy_the_protocol(tiny_model, chatml_tokenizer):
    assert isinstance(TransformersPolicy(tiny_model, chatml_tokenizer), Policy)
    assert isinstance(ScriptedPolicy(chatml_tokenizer), Policy)


def test_left_padded_batch_generates_what_each_prompt_does_alone(tiny_model, chatml_tokenizer, prompts):
    policy = TransformersPolicy(tiny_model, chatml_tokenizer)
    batch = greedy(policy, prompts, max_new_tokens=8)
    alone = [greedy(policy, [p], max_new_tokens=8)[0] for p in prompts]
    assert [g.token_ids for g in batch] == [g.token_ids for g in alone]
    assert all(len(g.token_ids) == 8 and g.finish_reason == "length" for g in batch)


def test_completion_ends_at_its_stop_token_with_no_padding_after(tiny_model, chatml_tokenizer, prompts):
    policy = TransformersPolicy(tiny_model, chatml_tokenizer)
    free = greedy(policy, prompts, max_new_tokens=12)
    stop = free[0].token_ids[3]
    first = free[0].token_ids.index(stop)
    stopped = greedy(policy, prompts, max_new_tokens=12, stop_token_ids=(stop,))
    assert stopped[0].token_ids == free[0].token_ids[: first + 1]
    assert stopped[0].finish_reason == "stop"
    assert len(stopped[0].logprobs) == len(stopped[0].token_ids)
    # the other row is unaffected unless it produced the same token
    if stop not in free[1].token_ids:
        assert stopped[1].token_ids == free[1].token_ids


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, max_new_tokens=10),
        SamplingParams(temperature=1.3, top_k=7, max_new_tokens=10),
        SamplingParams(temperature=1.0, top_p=0.6, max_new_tokens=10),
    ],
    ids=["temperature", "top_k", "top_p"],
)
def test_logprobs_are_the_temperature_scaled_models_and_samples_respect_the_truncation(
    tiny_model, chatml_tokenizer, prompts, params
):
    """Old log-probs must be what the loss recomputes (ratio 1 on-policy); top-k/top-p still
    decide which tokens can be sampled."""
    torch.manual_seed(0)
    generations = TransformersPolicy(tiny_model, chatml_tokenizer).generate(prompts, params)
    for prompt, gen in zip(prompts, generations):
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad():
            logits = tiny_model(ids).logits
        recomputed = token_logprobs(logits, ids, temperature=params.temperature)[0, len(prompt) :]
        assert torch.allclose(torch.tensor(gen.logprobs), recomputed, atol=1e-4)
        scores = logits[0, len(prompt) - 1 : -1].float() / params.temperature
        if params.top_k:
            kth = scores.topk(params.top_k, dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if params.top_p < 1:
            probs, order = scores.softmax(-1).sort(dim=-1, descending=True)
            drop = probs.cumsum(-1) - probs > params.top_p
            scores = scores.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
        kept = scores.gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)
        assert torch.isfinite(kept).all(), "a sampled token lay outside the top-k/top-p support"


def test_unwarped_logprobs_match_what_training_recomputes(tiny_model, chatml_tokenizer, prompts):
    torch.manual_seed(1)
    params = SamplingParams(temperature=0.8, max_new_tokens=6)
    gen = TransformersPolicy(tiny_model, chatml_tokenizer).generate(prompts[:1], params)[0]
    ids = torch.tensor([prompts[0] + gen.token_ids])
    with torch.no_grad():
        recomputed = token_logprobs(tiny_model(ids).logits, ids, temperature=0.8)[0, len(prompts[0]) :]
    assert torch.allclose(recomputed, torch.tensor(gen.logprobs), atol=1e-4)


def test_the_models_own_sampling_defaults_do_not_apply(tiny_model, chatml_tokenizer, prompts):
    config = tiny_model.generation_config
    saved = (config.top_k, config.repetition_penalty)
    config.top_k, config.repetition_penalty = 1, 5.0
    policy = TransformersPolicy(tiny_model, chatml_tokenizer)
    try:
        torch.manual_seed(2)
        sampled = policy.generate(prompts[:1], SamplingParams(temperature=1.0, max_new_tokens=8))[0]
        argmax = greedy(policy, prompts[:1], max_new_tokens=8)[0]
    finally:
        config.top_k, config.repetition_penalty = saved
    assert sampled.token_ids != argmax.token_ids  # top_k=1 would make sampling greedy
    ids = torch.tensor([prompts[0] + sampled.token_ids])
    with torch.no_grad():
        plain = token_logprobs(tiny_model(ids).logits, ids)[0, len(prompts[0]) :]
    assert torch.allclose(plain, torch.tensor(sampled.logprobs), atol=1e-4)  # no repetition penalty


def test_context_limit_shortens_the_completion_and_says_so(tiny_model, chatml_tokenizer, prompts):
    long, short = prompts
    policy = TransformersPolicy(tiny_model, chatml_tokenizer, max_model_len=len(short) + 3)
    cut, room = greedy(policy, [long, short], max_new_tokens=10)
    assert len(long) > len(short) + 3
    assert cut.token_ids == [] and cut.finish_reason == "context"
    assert len(room.token_ids) <= 3
    assert room.finish_reason in ("context", "stop")


def test_scripted_policy_replies_then_stops(chatml_tokenizer):
    policy = ScriptedPolicy(chatml_tokenizer, reply=lambda prompt: str(len(prompt)))
    gens = policy.generate([[1, 2], [1, 2, 3]], SamplingParams(stop_token_ids=(7, 9)))
    assert [chatml_tokenizer.decode(g.token_ids[:-1]) for g in gens] == ["2", "3"]
    assert all(g.token_ids[-1] == 7 and g.finish_reason == "stop" for g in gens)
    assert policy.calls == 1


def test_generates_in_eval_mode_and_restores_training_mode(tiny_model, chatml_tokenizer, prompts):
    modes = []
    hook = tiny_model.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    tiny_model.train()
    try:
        TransformersPolicy(tiny_model, chatml_tokenizer).generate(prompts, SamplingParams(max_new_tokens=2))
        assert tiny_model.training
    finally:
        hook.remove()
        tiny_model.eval()
    assert modes and not any(modes)


def test_copies_of_a_prompt_share_one_prefill_and_generate_what_each_does_alone(tiny_model, chatml_tokenizer, prompts):
    long, short = prompts
    batch_sizes = []
    hook = tiny_model.register_forward_pre_hook(
        lambda module, args, kwargs: batch_sizes.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    policy = TransformersPolicy(tiny_model, chatml_tokenizer)
    try:
        shared = greedy(policy, [long, short, long, short, long], max_new_tokens=6)
    finally:
        hook.remove()
    assert batch_sizes[0] == (2, len(long) - 1)  # one prefill per distinct prompt, last token left to generate
    assert batch_sizes[1] == (5, 1)
    alone = {len(p): greedy(policy, [p], max_new_tokens=6)[0] for p in prompts}
    for prompt, gen in zip([long, short, long, short, long], shared):
        assert gen.token_ids == alone[len(prompt)].token_ids
        assert torch.allclose(torch.tensor(gen.logprobs), torch.tensor(alone[len(prompt)].logprobs), atol=1e-4)


def test_the_inverse_cdf_sampler_draws_each_token_at_its_probability():
    from agilerl.generation.policy import _TokenChooser

    probs = torch.tensor([0.5, 0.3, 0.0, 0.2])
    chooser = _TokenChooser(SamplingParams(temperature=1.0))
    torch.manual_seed(3)
    draws = 20_000
    scores = chooser(torch.zeros((draws, 1), dtype=torch.long), probs.log().expand(draws, -1).clone())
    picks = scores.argmax(dim=-1)
    assert torch.isneginf(scores).sum(dim=-1).eq(3).all()  # exactly one finite score per row: the pick
    frequencies = torch.bincount(picks, minlength=4) / draws
    assert frequencies[2] == 0  # a token of probability 0 is never drawn
    assert torch.allclose(frequencies, probs, atol=0.02)  # 0.02 is over 5 standard deviations here
    assert torch.allclose(chooser.chosen_logprobs()[:, 0], probs.log()[picks])
