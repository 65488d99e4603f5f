"""vLLM against TransformersPolicy, interleaved in one process: the whole GRPO step (generation,
fp32 update, and for vLLM the weight push) and its generation, per backend, on the same model.

    .venv-vllm/bin/python bench/vllm_step.py                       # tiny and SmolLM2-135M
    .venv-vllm/bin/python bench/vllm_step.py --models tiny --steps 3   # quick: about a minute

Run it in ``.venv-vllm`` (vLLM needs transformers<5.20; see docs/generation.md). Every backend
generates ``batch x group`` completions of exactly ``--completion-tokens`` tokens (stopping off)
for the same chat-templated prompts, as bench/train_step.py does. The GRPO step is
``collate_trajectories`` + ``GRPO.loss`` + backward + AdamW on the fp32 model, and for vLLM the
push of the updated weights (``load_weights(hf_weights(model))``). Backends:

- ``transformers``: ``TransformersPolicy`` on the fp32 model;
- ``vllm``: a colocated fp32 engine (``dtype: auto``, the default);
- ``vllm-bf16``: a colocated bf16 engine fed by the fp32 trainer (``generation: {dtype: bfloat16}``,
  the user's choice: its log-probs are bf16's, so the on-policy ratio is 1 only within bf16 error);
- ``transformers-bf16`` (generation only): ``TransformersPolicy`` on a bf16 copy.

All share one model and optimiser (the work of a step does not depend on which backend's step
came before). Each round runs every backend once, in a rotated order, so load on a shared host
falls on all of them alike; the first round is warm-up and the median of the others is reported.
In process, the engines bind no thread: :class:`VLLMPolicy` gives torch back the trainer's threads
(``--threads``, default torch's own) once they are up. ``tiny`` here has 2 heads (head_dim 32:
vLLM's CPU attention has no head_dim 16 kernel); SmolLM2 is loaded as bench/train_step.py loads it.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step import PROMPTS, _load, _prompt_ids, bandit_trajectories  # noqa: E402

STEPPED = ("transformers", "vllm", "vllm-bf16")
GENERATION_ONLY = ("transformers-bf16",)
COMPILED = ("vllm-compiled", "vllm-bf16-compiled")  # --compiled: stepped like the others


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


def build_policies(model: Any, tokenizer: Any, compiled: bool) -> dict[str, Any]:
    """Each backend's policy over the one fp32 model (a bf16 copy for ``transformers-bf16``)."""
    import torch

    from agilerl.generation.policy import TransformersPolicy
    from agilerl.generation.vllm.policy import VLLMPolicy

    policies = {
        "transformers": fixed_length(TransformersPolicy(model, tokenizer, max_model_len=1024)),
        "vllm": fixed_length(VLLMPolicy(model, tokenizer, max_model_len=1024)),
        "vllm-bf16": fixed_length(VLLMPolicy(model, tokenizer, max_model_len=1024, dtype="bfloat16")),
        "transformers-bf16": fixed_length(
            TransformersPolicy(copy.deepcopy(model).to(torch.bfloat16), tokenizer, max_model_len=1024)
        ),
    }
    if compiled:  # torch.compile'd engines (generation: {enforce_eager: false}): a minute to start each
        policies["vllm-compiled"] = fixed_length(VLLMPolicy(model, tokenizer, max_model_len=1024, enforce_eager=False))
        policies["vllm-bf16-compiled"] = fixed_length(
            VLLMPolicy(model, tokenizer, max_model_len=1024, dtype="bfloat16", enforce_eager=False)
        )
    return policies


def bench_model(name: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Median seconds per backend: generation, update, push and the whole step."""
    from agilerl.builtins.algorithms.grpo import GRPO
    from agilerl.generation.policy import SamplingParams
    from agilerl.generation.weights import hf_weights
    from agilerl.train.batch import collate_trajectories
    from agilerl.train.trainer import build_optimizer

    model, tokenizer = load(name)
    prompts = [_prompt_ids(tokenizer, p) for p in PROMPTS[: args.batch] for _ in range(args.group)]
    params = SamplingParams(max_new_tokens=args.completion_tokens)
    policies = build_policies(model, tokenizer, args.compiled)
    algorithm, optimizer = GRPO(), build_optimizer(list(model.parameters()), lr=1e-6)
    backends = [*STEPPED, *(COMPILED if args.compiled else ()), *GENERATION_ONLY]
    rows: dict[str, list[tuple[float, float, float]]] = {b: [] for b in backends}
    for step in range(args.steps):
        for backend in backends[step % len(backends):] + backends[: step % len(backends)]:
            policy = policies[backend]
            t0 = time.perf_counter()
            generations = policy.generate(prompts, params)
            t1 = time.perf_counter()
            if backend in GENERATION_ONLY:
                rows[backend].append((t1 - t0, 0.0, 0.0))
                continue
            batch = collate_trajectories(bandit_trajectories(prompts, generations, args.group), tokenizer.pad_token_id)
            model.train()
            loss, _ = algorithm.loss(model, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            t2 = time.perf_counter()
            if hasattr(policy, "load_weights"):
                policy.load_weights(hf_weights(model))
            rows[backend].append((t1 - t0, t2 - t1, time.perf_counter() - t2))
    out = {}
    for backend, timed in rows.items():
        counted = timed[1:] or timed
        gen, update, push = (statistics.median(r[i] for r in counted) for i in range(3))
        out[backend] = {"generation_s": gen, "update_s": update, "push_s": push, "step_s": gen + update + push}
    return out


def report(name: str, r: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    import torch

    tokens = args.batch * args.group * args.completion_tokens
    print(f"\n{name}: batch {args.batch} x group {args.group} x {args.completion_tokens} tokens, "
          f"{torch.get_num_threads()} torch threads, {args.steps - 1} timed rounds, load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    base = r["transformers"]
    print(f"  {'backend':<18} {'generation':>10} {'tok/s':>6} {'update':>7} {'push':>6} {'step':>7}  "
          f"{'gen x':>6} {'step x':>6}")
    for backend, t in r.items():
        stepped = backend not in GENERATION_ONLY
        cells = [f"{t[k]:.2f}s" if stepped else "-" for k in ("update_s", "push_s", "step_s")]
        step_ratio = f"{base['step_s'] / t['step_s']:.2f}x" if stepped else "-"
        gen = t["generation_s"]
        print(f"  {backend:<18} {gen:>9.2f}s {tokens / gen:>6.0f} {cells[0]:>7} {cells[1]:>6} {cells[2]:>7}  "
              f"{base['generation_s'] / gen:>5.2f}x {step_ratio:>6}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--completion-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4, help="rounds, the first one warm-up")
    parser.add_argument("--threads", type=int, help="torch intra-op threads for every backend (default: torch's)")
    parser.add_argument("--compiled", action="store_true",
                        help="also torch.compile'd engines (enforce_eager: false), fp32 and bf16")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    for name in args.models:
        report(name, bench_model(name, args), args)


if __name__ == "__main__":  # vLLM may spawn processes: engines start only here
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    main()
