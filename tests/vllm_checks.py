"""What tests/test_vllm.py asserts, computed in ``.venv-vllm`` (vLLM needs transformers<5.20):
one colocated engine on a tiny model, driven through the real collector, harness and trainer.

    .venv-vllm/bin/python tests/vllm_checks.py REPORT.json

Writes one JSON report; the test module reads it. The tiny model has 2 heads (head_dim 32):
vLLM's CPU attention has no kernel for the registered ``tiny``'s head_dim 16.
"""

from __future__ import annotations

import json
import os
import sys
import time

MAX_MODEL_LEN = 256
ASYNC_STEPS = 4


def tiny(seed: int = 0):
    from agilerl.train.tiny_model import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer("chatml")
    return build_tiny_model(tokenizer, num_heads=2, seed=seed), tokenizer


GUESS_PROMPT = "<|im_start|>user\nReply with one number.<|im_end|>\n<|im_start|>assistant\n"


def guess_env():
    """examples/guess/manifest.yaml's env."""
    from agilerl.builtins.guess import GuessEnv

    env = GuessEnv(low=1, high=10, target=7)
    env.system_prompt = "Reply with one number."
    return env


def train_on_guess(model, tokenizer, training, policy=None):
    """GRPO on :func:`guess_env` through the real collector and trainer, ``policy`` generating
    (the trainer's own model when None); the batch and group are ``training``'s."""
    from agilerl.generation.policy import SamplingParams
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.train.loops import train_llm_rollout

    with RolloutCollector(guess_env, tokenizer, batch_size=training.batch_size, group_size=training.group_size,
                          max_turns=3, seed=0, sampling=SamplingParams(max_new_tokens=3)) as collector:
        train_llm_rollout(model, tokenizer, collector, "grpo", training, show_progress=False,
                          generation=policy, max_model_len=MAX_MODEL_LEN)


class Recorder:
    """The policy, with every (prompt, generation) it produced kept."""

    def __init__(self, policy):
        self.policy, self.seen = policy, []

    def generate(self, prompts, params):
        out = self.policy.generate(prompts, params)
        self.seen += [(list(p), g) for p, g in zip(prompts, out)]
        return out


def trajectories_are_what_vllm_generated(policy, tokenizer, report):
    """Every generation appears in its trajectory verbatim, masked as the policy's, with its log-probs."""
    from agilerl.builtins.guess import GuessEnv
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.generation.policy import SamplingParams

    recorder = Recorder(policy)
    sampling = SamplingParams(temperature=0.7, max_new_tokens=6)
    with RolloutCollector(GuessEnv, tokenizer, batch_size=2, group_size=4, sampling=sampling, seed=0) as collector:
        batch = collector.collect(recorder)
    found = 0
    for prompt, gen in recorder.seen:
        end = len(prompt) + len(gen.token_ids)
        for t in batch.trajectories:
            if t.token_ids[:end] == prompt + gen.token_ids and all(t.action_mask[len(prompt) : end]):
                assert not any(t.action_mask[len(prompt) - 1 : len(prompt)]), "a prompt token is masked as generated"
                if t.logprobs[len(prompt) : end] == gen.logprobs:
                    found += 1
                    break
    report["generations"] = len(recorder.seen)
    report["generations_found_verbatim"] = found
    report["finish_reasons"] = sorted({g.finish_reason for _, g in recorder.seen})
    report["generated_tokens"] = sum(len(g.token_ids) for _, g in recorder.seen)
    return batch, sampling


def logprobs_match_the_trainers_recompute(model, tokenizer, batch, sampling, report):
    """The trainer's own recompute (``policy_logprobs``, at the sampler's temperature) of vLLM's tokens."""
    import torch

    from agilerl.train.batch import collate_trajectories
    from agilerl.train.logprobs import policy_logprobs

    tensors = collate_trajectories(batch.trajectories, tokenizer.pad_token_id)
    with torch.no_grad():
        recomputed = policy_logprobs(
            model.eval(), tensors.input_ids, tensors.attention_mask, temperature=sampling.temperature,
            mask=tensors.action_mask,
        )
    mask = tensors.action_mask
    diff = (recomputed - tensors.old_logprobs).abs()[mask]
    report["logprob_max_abs_diff"] = float(diff.max())
    report["ratio_max_abs_dev"] = float((diff.exp() - 1).abs().max())
    # the same tokens scored at temperature 1: what a sampler ignoring temperature would have logged
    with torch.no_grad():
        plain = policy_logprobs(model, tensors.input_ids, tensors.attention_mask, mask=mask)
    report["logprob_diff_if_temperature_ignored"] = float((plain - tensors.old_logprobs).abs()[mask].max())


def sampling_semantics_match_transformers(policy, model, tokenizer, report):
    """Greedy tokens, stops and the context limit as TransformersPolicy gives them."""
    from agilerl.generation.policy import SamplingParams, TransformersPolicy

    hf = TransformersPolicy(model, tokenizer, max_model_len=MAX_MODEL_LEN)
    prompt = tokenizer.encode("<|im_start|>user\nguess a number<|im_end|>\n<|im_start|>assistant\n")
    long_prompt = (prompt * 40)[: MAX_MODEL_LEN - 3]  # room for 3 tokens
    full_prompt = (prompt * 40)[:MAX_MODEL_LEN]  # no room at all
    greedy = SamplingParams(temperature=0, max_new_tokens=16, stop_token_ids=(tokenizer.eos_token_id,))
    ours = policy.generate([prompt, long_prompt, full_prompt], greedy)
    theirs = hf.generate([prompt, long_prompt, full_prompt], greedy)
    report["greedy_same_tokens"] = [a.token_ids == b.token_ids for a, b in zip(ours, theirs)]
    report["greedy_finish"] = [[a.finish_reason, b.finish_reason] for a, b in zip(ours, theirs)]
    report["context_lengths"] = [len(ours[1].token_ids), len(ours[2].token_ids)]
    # a stop id the model emits greedily: both end on it, with nothing after
    stop = theirs[0].token_ids[2]
    stopping = SamplingParams(temperature=0, max_new_tokens=16, stop_token_ids=(stop,))
    a, b = policy.generate([prompt], stopping)[0], hf.generate([prompt], stopping)[0]
    report["stop_id"] = [a.token_ids == b.token_ids, a.finish_reason, a.token_ids[-1] == stop]
    # top-k 1 samples the argmax whatever the temperature
    top1 = policy.generate([prompt] * 4, SamplingParams(temperature=1.0, top_k=1, max_new_tokens=8))
    report["top_k_1_is_greedy"] = all(g.token_ids == theirs[0].token_ids[:8] for g in top1)
    return prompt, greedy


def generation_follows_pushed_weights(policy, tokenizer, prompt, greedy, report):
    """After a push (a different model's weights, then a LoRA-merged one) greedy output is the new model's."""
    import torch

    from agilerl.generation.policy import TransformersPolicy
    from agilerl.generation.weights import hf_weights

    first = policy.generate([prompt], greedy)[0]
    before = first.token_ids
    other, _ = tiny(seed=1)
    t0 = time.perf_counter()
    policy.load_weights(hf_weights(other))
    report["push_s"] = time.perf_counter() - t0
    after = policy.generate([prompt], greedy)[0].token_ids  # same prompt: a stale prefix cache would show
    expected = TransformersPolicy(other, tokenizer, max_model_len=MAX_MODEL_LEN).generate([prompt], greedy)[0].token_ids
    pushed = policy.generate([prompt], greedy)[0]
    report["push_changed_output"] = after != before or pushed.logprobs != first.logprobs
    report["push_matches_new_model"] = after == expected

    import peft

    lora = peft.get_peft_model(other, peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)  # adapters that change the output (B starts at zero)
    policy.load_weights(hf_weights(lora))
    merged = policy.generate([prompt], greedy)[0].token_ids
    report["lora_changed_output"] = merged != after
    report["lora_matches_peft_model"] = merged == TransformersPolicy(lora, tokenizer, max_model_len=MAX_MODEL_LEN).generate([prompt], greedy)[0].token_ids


def grpo_runs(policy, out_dir, report, steps):
    """The guess example's GRPO, ``steps`` steps, on each backend from the same initial model."""
    from agilerl.generation.policy import SamplingParams, TransformersPolicy
    from agilerl.generation.weights import hf_weights
    from agilerl.manifest.settings import TrainingSettings
    from agilerl.train.metrics import read_metrics

    for backend in ("transformers", "vllm"):
        model, tokenizer = tiny(seed=0)
        if backend == "vllm":
            policy.load_weights(hf_weights(model))  # the engine now holds this run's starting weights
        training = TrainingSettings(
            batch_size=8, group_size=8, max_steps=steps, lr=3e-3, max_new_tokens=3, evaluation_interval=steps,
            eval_episodes=1, seed=0, output_dir=os.path.join(out_dir, backend),
        )
        t0 = time.perf_counter()
        train_on_guess(model, tokenizer, training, policy if backend == "vllm" else None)
        rows = [r for r in read_metrics(os.path.join(out_dir, backend, "metrics.jsonl")) if "train/reward" in r]
        report[f"grpo_{backend}"] = {
            "seconds": time.perf_counter() - t0,
            "rewards": [r["train/reward"] for r in rows],
            "step_s": [r["time/step_s"] for r in rows],
            "weight_sync_s": [r.get("time/weight_sync_s") for r in rows],
            "clip_fraction": [r.get("algo/clip_fraction") for r in rows],
            "ratio_keys": sorted(k for k in rows[0] if k.startswith("algo/")),
        }
        if backend == "vllm":  # the engine holds the trained weights: greedy output is the trainer's
            prompt, greedy = tokenizer.encode(GUESS_PROMPT), SamplingParams(temperature=0, max_new_tokens=8)
            report["after_training_engine_matches_trainer"] = (
                policy.generate([prompt], greedy)[0].token_ids
                == TransformersPolicy(model, tokenizer, max_model_len=MAX_MODEL_LEN).generate([prompt], greedy)[0].token_ids
            )


def async_grpo_runs(policy, out_dir, report, steps):
    """GRPO in async mode on this engine (from a fresh model's weights): the engine generates during
    the update, takes each step's weights between two generate calls, and ends on the trained ones."""
    from agilerl.generation.policy import SamplingParams, TransformersPolicy
    from agilerl.generation.weights import hf_weights
    from agilerl.manifest.settings import TrainingSettings
    from agilerl.train.metrics import read_metrics

    model, tokenizer = tiny(seed=0)
    policy.load_weights(hf_weights(model))
    out = os.path.join(out_dir, "async")
    training = TrainingSettings(
        batch_size=4, group_size=4, max_steps=steps, lr=3e-3, max_new_tokens=3, evaluation_interval=0,
        seed=0, output_dir=out, rollout_mode="async", max_staleness=1,
    )
    train_on_guess(model, tokenizer, training, policy)
    rows = [r for r in read_metrics(os.path.join(out, "metrics.jsonl")) if "train/reward" in r]
    prompt, greedy = tokenizer.encode(GUESS_PROMPT), SamplingParams(temperature=0, max_new_tokens=8)
    report["async"] = {
        "steps": [r["step"] for r in rows],
        "staleness_max": [r["rollout/staleness_max"] for r in rows],
        "weight_sync_s": [r.get("time/weight_sync_s") for r in rows],
        "engine_matches_trainer": policy.generate([prompt], greedy)[0].token_ids
        == TransformersPolicy(model, tokenizer, max_model_len=MAX_MODEL_LEN).generate([prompt], greedy)[0].token_ids,
    }


def agent_calls_are_what_vllm_generated(policy, tokenizer, report):
    """An agent program's two chat calls through the endpoint, generated by this engine: the
    episode's one sample holds exactly the tokens vLLM generated (the completions, masked as the
    policy's), and each reply the program got decodes from them."""
    import urllib.request

    from agilerl.agents.endpoint import AgentEndpoint
    from agilerl.generation.policy import SamplingParams

    recorder = Recorder(policy)
    sampling = SamplingParams(temperature=0.7, max_new_tokens=6, stop_token_ids=(tokenizer.convert_tokens_to_ids("<|im_end|>"),))
    endpoint = AgentEndpoint(tokenizer)
    try:
        episode = endpoint.open_episode("vllm-agent", recorder, sampling)
        messages, replies = [{"role": "user", "content": "Count with me."}], []
        for _ in range(2):
            request = urllib.request.Request(
                endpoint.base_url + "/chat/completions", json.dumps({"model": "m", "messages": messages}).encode(),
                {"Authorization": f"Bearer {episode.key}", "Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=120) as response:
                message = json.loads(response.read())["choices"][0]["message"]
            replies.append(message["content"])
            messages += [message, {"role": "user", "content": "And then?"}]
        (sample,) = episode.trajectories()
    finally:
        endpoint.close()
    trained = [i for i, m in zip(sample.token_ids, sample.action_mask) if m]
    generated = [t for _, g in recorder.seen for t in g.token_ids]
    report["agent_calls"] = len(recorder.seen)
    report["agent_trained_tokens_are_vllms"] = trained == generated and len(generated) > 0
    report["agent_prompts_are_the_sample"] = all(
        sample.token_ids[: len(prompt)] == prompt for prompt, _ in recorder.seen
    )
    report["agent_replies_decode_from_them"] = [
        tokenizer.decode(g.token_ids, skip_special_tokens=True) == reply
        for (_, g), reply in zip(recorder.seen, replies)
    ]


def main(report_path: str, steps: int) -> None:
    import torch

    from agilerl.generation.vllm.policy import VLLMPolicy

    report: dict = {}
    model, tokenizer = tiny(seed=0)
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    t0 = time.perf_counter()
    policy = VLLMPolicy(model, tokenizer, max_model_len=MAX_MODEL_LEN, seed=0)
    report["engine_start_s"] = time.perf_counter() - t0
    # the engine leaves the trainer's threads as they were, and torch's setter working: every test fails if not
    assert (torch.get_num_threads(), torch.set_num_threads) == (threads, set_threads), "vLLM changed torch's threads"
    batch, sampling = trajectories_are_what_vllm_generated(policy, tokenizer, report)
    logprobs_match_the_trainers_recompute(model, tokenizer, batch, sampling, report)
    prompt, greedy = sampling_semantics_match_transformers(policy, model, tokenizer, report)
    generation_follows_pushed_weights(policy, tokenizer, prompt, greedy, report)
    agent_calls_are_what_vllm_generated(policy, tokenizer, report)
    grpo_runs(policy, os.path.dirname(os.path.abspath(report_path)), report, steps)
    async_grpo_runs(policy, os.path.dirname(os.path.abspath(report_path)), report, ASYNC_STEPS)
    with open(report_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":  # vLLM may spawn processes: start engines only here
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 12)
