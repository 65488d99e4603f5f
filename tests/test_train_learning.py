"""The loops learn: GRPO takes the tiny model from chance to > 0.9 reward on the guess example,
and SFT lowers the held-out loss on the tiny SFT dataset.

Each test's work is bounded by its steps, not by the clock: the timeouts only catch a hang, set
at more than 3x what each took alone on a busy 2-core host (GRPO's 90 steps: 415 s with the
host's load average at 5-8, where the main job's 100 steps take 24 s idle; SFT's 30 steps: 10 s).
Both are marked slow: ``-m "not slow"`` leaves them out while developing; CI runs them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agilerl.manifest.spec import load_manifest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

pytestmark = pytest.mark.slow


def train_example(name: str, steps: int, output_dir: Path) -> tuple[Any, list[dict[str, Any]], list[float]]:
    """GRPO on ``examples/<name>/manifest.yaml`` for ``steps`` steps, evaluated before and at the
    end: the result, the metrics rows and each step's train reward."""
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.generation.policy import SamplingParams
    from agilerl.train.loops import train_llm_rollout
    from agilerl.train.metrics import read_metrics
    from agilerl.assembly.models import load_model_and_tokenizer

    manifest = load_manifest(EXAMPLES / name / "manifest.yaml")
    training = manifest.training.model_copy(
        update={"max_steps": steps, "evaluation_interval": steps, "output_dir": str(output_dir)}
    )
    model, tokenizer = load_model_and_tokenizer(manifest.model, seed=training.seed)
    with RolloutCollector.from_spec(
        manifest.environment, tokenizer, base_dir=manifest.base_dir, seed=training.seed,
        batch_size=training.batch_size, group_size=training.group_size,
        sampling=SamplingParams(max_new_tokens=training.max_new_tokens),
    ) as collector:
        result = train_llm_rollout(model, tokenizer, collector, "grpo", training, show_progress=False)
    records = read_metrics(output_dir / "metrics.jsonl")
    return result, records, [r["train/reward"] for r in records if "train/reward" in r]


@pytest.mark.timeout(1500)
def test_grpo_learns_the_guess_example(tmp_path):
    result, records, rewards = train_example("guess", 90, tmp_path)
    assert records[0]["eval/reward"] < 0.5  # the untrained model's greedy guess is wrong
    assert sum(rewards[:5]) / 5 < 0.1  # sampling starts near chance
    assert max(rewards) > 0.9, rewards
    assert sum(rewards[-5:]) / 5 > 0.9
    assert result.metrics["eval/reward"] == 1.0  # greedy decoding now answers the target


def test_sft_lowers_the_held_out_loss(tmp_path):
    from agilerl.data.dataset_env import DatasetEnv
    from agilerl.train.loops import train_llm_dataset
    from agilerl.train.metrics import read_metrics
    from agilerl.assembly.models import load_model_and_tokenizer

    manifest = load_manifest(EXAMPLES / "sft" / "manifest.yaml")
    training = manifest.training.model_copy(
        update={"max_steps": 30, "lr": 3e-3, "evaluation_interval": 30, "output_dir": str(tmp_path)}
    )
    model, tokenizer = load_model_and_tokenizer(manifest.model)
    dataset = DatasetEnv.from_spec(
        manifest.environment, tokenizer, base_dir=manifest.base_dir, batch_size=training.batch_size
    )
    train_llm_dataset(model, tokenizer, dataset, "sft", training, show_progress=False)
    evals = [r["eval/loss"] for r in read_metrics(tmp_path / "metrics.jsonl") if "eval/loss" in r]
    assert len(evals) == 2  # before training and at the end
    assert evals[1] < evals[0] - 1.0, evals
