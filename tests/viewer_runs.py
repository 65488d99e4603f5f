"""Small real runs the records and viewer tests share: a GRPO run of examples/guess, a vision
run's records (the tiny VLM on the colours env), a tool run's records (the hermes parser on a
calculator env), an eval results file, and a synthetic run of any size."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import yaml

from agilerl.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
GUESS = ROOT / "examples" / "guess"


def guess_manifest(folder: Path, **training: object) -> Path:
    """examples/guess with a small step (2 tasks x 2 rollouts) and ``training`` changed."""
    folder.mkdir(parents=True, exist_ok=True)
    manifest = yaml.safe_load((GUESS / "manifest.yaml").read_text())
    manifest["training"].update(batch_size=2, group_size=2, evaluation_interval=0, **training)
    path = folder / "manifest.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def train_run(folder: Path, steps: int = 3, **training: object) -> Path:
    """``agilerl train`` of the guess example for ``steps`` steps; its output folder."""
    out = folder / "run"
    manifest = guess_manifest(folder, **training)
    assert main(["train", str(manifest), "--output-dir", str(out), "--max-steps", str(steps), "--no-progress"]) == 0
    return out


def vision_run(folder: Path) -> Path:
    """The colours env played by the tiny VLM, its samples recorded as a training step records them."""
    from agilerl.builtins.colors import ColorsEnv
    from agilerl.generation.policy import SamplingParams, TransformersPolicy
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.train.metrics import MetricsLog
    from agilerl.train.records import RolloutRecorder
    from agilerl.train.tiny_model import tiny_vlm_and_tokenizer

    model, tokenizer = tiny_vlm_and_tokenizer()
    out = folder / "vision"
    recorder = RolloutRecorder(out, tokenizer, "all")
    log = MetricsLog(out)
    with RolloutCollector(lambda: ColorsEnv(size=320, noise=8, format_reward=0.2), tokenizer, batch_size=2,
                          group_size=2, seed=0, sampling=SamplingParams(max_new_tokens=2)) as collector:
        for step in (1, 2):
            batch = collector.collect(TransformersPolicy(model, tokenizer))
            recorder.add(batch.trajectories, version=step - 1)
            recorder.write(step)
            log.write(step, {"train/reward": batch.stats.reward_mean, **batch.stats.metrics()})
    return out


def tool_run(folder: Path) -> Path:
    """A calculator env's episodes through the hermes parser: good calls, a bad one, a submit."""
    from agilerl.llm_envs import RolloutHarness
    from agilerl.train.metrics import MetricsLog
    from agilerl.train.records import RolloutRecorder
    from tests.test_tools_harness import CalcEnv, _completion
    from tests.tool_families import family_tokenizer

    tokenizer = family_tokenizer("hermes")
    out = folder / "tools"
    recorder = RolloutRecorder(out, tokenizer, "all")
    trajectories = []
    for group, answer in enumerate((5, 4)):
        harness = RolloutHarness.local(CalcEnv(), tokenizer, tool_parser="hermes")
        parser = harness.tool_routing.parser
        harness.reset(seed=group)
        harness.step(_completion(tokenizer, parser, [("add", {"a": 2, "b": 3}), ("nope", {})]))
        harness.step(_completion(tokenizer, parser, [("submit", {"answer": answer})]))
        harness.trajectory.group = group
        trajectories.append(harness.trajectory)
    recorder.add(trajectories, version=0)
    recorder.write(1)
    MetricsLog(out).write(1, {"train/reward": 0.5, "tools/calls_per_episode": 3.0})
    return out


def eval_file(folder: Path) -> Path:
    """``agilerl eval`` of the tiny model on the guess env: two tasks, two samples each."""
    out = folder / "eval.jsonl"
    args = ["eval", "guess", "--model", "tiny", "--env-config", '{"target": 7}', "-n", "2", "-k", "2",
            "--max-new-tokens", "3", "--output", str(out), "--no-progress", "--json"]
    assert main(args) == 0
    return out


def synthetic_run(folder: Path, steps: int, per_step: int) -> Path:
    """A run's files of ``steps x per_step`` records as the trainer writes them: bench/viewer.py's,
    which times what the tests bound."""
    spec = importlib.util.spec_from_file_location("bench_viewer", ROOT / "bench" / "viewer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write_run(folder, steps, per_step)


def copy_run(run: Path, to: Path) -> Path:
    """A copy of a run folder (a test that changes a run keeps the shared one whole)."""
    shutil.copytree(run, to)
    return to
