"""vLLM against TransformersPolicy in the same run: the generation step (fp32 and bf16) and the
whole GRPO step (generation, update, and for vLLM the weight push), per backend.

    .venv-vllm/bin/python bench/vllm_step.py                     # tiny and SmolLM2-135M
    .venv-vllm/bin/python bench/vllm_step.py --models tiny --steps 3

Run it in ``.venv-vllm`` (vLLM needs transformers<5.20; see docs/generation.md). Both backends
generate ``batch x group`` completions of exactly ``--completion-tokens`` tokens (stopping off)
for the same chat-templated prompts, as bench/train_step.py does; the GRPO step is
``collate_trajectories`` + ``GRPO.loss`` + backward + AdamW, and with vLLM the push of the
updated weights (``load_weights(hf_weights(model))``). Each backend runs in its own process.
The first step of each is warm-up; the median of the others is reported. ``tiny`` here has 2 heads (head_dim 32: vLLM's CPU attention
has no head_dim 16 kernel); SmolLM2 is loaded as bench/train_step.py loads it.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step import PROMPTS, _load, _prompt_ids, bandit_trajectories  # noqa: E402


def load(name: str) -> tuple[Any, Any]:
    if name == "tiny":
        from agilerl.train.tiny_model import build_tiny_model, build_tiny_tokenizer

        tokenizer = build_tiny_tokenizer("chatml")
        return build_tiny_model(tokenizer, num_heads=2), tokenizer
    return _load(name)


def fixed_length(policy: Any) -> Any:
    """No stop token at all: every completion runs to ``max_new_tokens``."""
    if hasattr(policy, "eos_id"):
        policy.eos_id = None
    else:
        policy.stops = []
    return policy


def generation_s(policy: Any, prompts: list[list[int]], params: Any, steps: int) -> tuple[float, int]:
    times, tokens = [], 0
    for _ in range(steps):
        t0 = time.perf_counter()
        out = policy.generate(prompts, params)
        times.append(time.perf_counter() - t0)
        tokens = sum(len(g.token_ids) for g in out)
    return statistics.median(times[1:] or times), tokens


def grpo_step_s(policy: Any, model: Any, tokenizer: Any, prompts: list[list[int]], params: Any, args: Any) -> dict[str, float]:
    """Median (generation, update, push, whole) seconds of one GRPO step."""
    from agilerl.builtins.algorithms.grpo import GRPO
    from agilerl.rollout.weights import hf_weights
    from agilerl.train.batch import collate_trajectories
    from agilerl.train.loops import build_optimizer

    algorithm, optimizer = GRPO(), build_optimizer(list(model.parameters()), lr=1e-6)
    rows = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        generations = policy.generate(prompts, params)
        t1 = time.perf_counter()
        trajectories = bandit_trajectories(prompts, generations, args.group)
        batch = collate_trajectories(trajectories, tokenizer.pad_token_id)
        model.train()
        loss, _ = algorithm.loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        t2 = time.perf_counter()
        if hasattr(policy, "load_weights"):
            policy.load_weights(hf_weights(model))
        t3 = time.perf_counter()
        rows.append((t1 - t0, t2 - t1, t3 - t2, t3 - t0))
    counted = rows[1:] or rows
    return {k: statistics.median(r[i] for r in counted) for i, k in enumerate(("generation_s", "update_s", "push_s", "step_s"))}


def bench_side(name: str, backend: str, args: argparse.Namespace) -> dict[str, Any]:
    """One backend on one model, fp32 then bf16 generation and the fp32 GRPO step (in this process)."""
    import torch

    from agilerl.rollout.policy import SamplingParams, TransformersPolicy

    model, tokenizer = load(name)
    prompts = [_prompt_ids(tokenizer, p) for p in PROMPTS[: args.batch] for _ in range(args.group)]
    params = SamplingParams(max_new_tokens=args.completion_tokens)
    out: dict[str, Any] = {}
    for dtype in ("float32", "bfloat16"):
        typed = model if dtype == "float32" else copy.deepcopy(model).to(torch.bfloat16)
        t0 = time.perf_counter()
        if backend == "vllm":
            from agilerl.rollout.vllm_policy import VLLMPolicy

            policy = fixed_length(VLLMPolicy(typed, tokenizer, max_model_len=1024, dtype=dtype))
        else:
            policy = fixed_length(TransformersPolicy(typed, tokenizer, max_model_len=1024))
        out[f"start_s_{dtype}"] = time.perf_counter() - t0
        seconds, tokens = generation_s(policy, prompts, params, args.steps)
        out[f"gen_{dtype}"] = {"s": seconds, "tok_per_s": tokens / seconds}
        if dtype == "float32":  # the whole step trains in fp32, as agilerl train does by default
            out["grpo"] = grpo_step_s(policy, model, tokenizer, prompts, params, args)
        del typed, policy
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--completion-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--side", nargs=2, metavar=("MODEL", "BACKEND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:  # a child: one side, its JSON on the last line
        print(json.dumps(bench_side(*args.side, args)), flush=True)
        return
    shared = ["--batch", str(args.batch), "--group", str(args.group),
              "--completion-tokens", str(args.completion_tokens), "--steps", str(args.steps)]
    for name in args.models:
        # each side in a fresh process: vLLM's CPU worker binds the OpenMP threads of its process,
        # which slows any torch work after it there (transformers' generation ran 2-4x slower)
        r = {}
        for backend in ("transformers", "vllm"):
            done = subprocess.run([sys.executable, __file__, *shared, "--side", name, backend],
                                  capture_output=True, text=True, check=True)
            r[backend] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"\n{name}: batch {args.batch} x group {args.group} x {args.completion_tokens} tokens")
        for dtype in ("float32", "bfloat16"):
            hf, vl = r["transformers"][f"gen_{dtype}"], r["vllm"][f"gen_{dtype}"]
            print(f"  generation {dtype}: transformers {hf['s']:.2f} s ({hf['tok_per_s']:.0f} tok/s), "
                  f"vllm {vl['s']:.2f} s ({vl['tok_per_s']:.0f} tok/s): {hf['s'] / vl['s']:.2f}x")
        a, b = r["transformers"]["grpo"], r["vllm"]["grpo"]
        print(f"  GRPO step fp32: transformers {a['step_s']:.2f} s (gen {a['generation_s']:.2f} + update "
              f"{a['update_s']:.2f}), vllm {b['step_s']:.2f} s (gen {b['generation_s']:.2f} + update "
              f"{b['update_s']:.2f} + push {b['push_s']:.2f}): {a['step_s'] / b['step_s']:.2f}x")
        print(f"  vllm engine start: {r['vllm']['start_s_float32']:.1f} s (fp32)", flush=True)


if __name__ == "__main__":  # vLLM may spawn processes: engines start only here
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    main()
