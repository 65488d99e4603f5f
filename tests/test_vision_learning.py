"""tiny-vlm learns the colors env (examples/colors) above chance within a bounded number of steps.

The question is the same every episode: only a model that looks at the square beats chance (half
the episodes, with two colours). Bounded by steps, not the clock; the timeout only catches a hang."""

from __future__ import annotations

from pathlib import Path

import pytest

from agilerl.manifest.spec import load_manifest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

pytestmark = pytest.mark.slow


@pytest.mark.timeout(2400)
def test_grpo_teaches_the_tiny_vlm_to_name_the_colour(tmp_path: Path) -> None:
    from agilerl.assembly.models import load_model_and_tokenizer
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.rollout.policy import SamplingParams
    from agilerl.train.loops import train_llm_rollout
    from agilerl.train.metrics import read_metrics

    manifest = load_manifest(EXAMPLES / "colors" / "manifest.yaml")
    training = manifest.training.model_copy(
        update={"max_steps": 50, "evaluation_interval": 50, "output_dir": str(tmp_path)}
    )
    model, tokenizer = load_model_and_tokenizer(manifest.model, seed=training.seed)
    with RolloutCollector.from_spec(
        manifest.environment, tokenizer, base_dir=manifest.base_dir, seed=training.seed,
        batch_size=training.batch_size, group_size=training.group_size,
        sampling=SamplingParams(max_new_tokens=training.max_new_tokens),
    ) as collector:
        result = train_llm_rollout(model, tokenizer, collector, "grpo", training, show_progress=False)

    records = read_metrics(tmp_path / "metrics.jsonl")
    rewards = [r["train/reward"] for r in records if "train/reward" in r]
    # a correct answer scores 1, a wrong digit 0.2: a model blind to the picture averages 0.6 at best
    assert records[0]["eval/reward"] < 0.7
    assert sum(rewards[:5]) / 5 < 0.3  # sampling starts far below even that
    assert sum(rewards[-5:]) / 5 > 0.85, rewards  # it looks at the square
    assert result.metrics["eval/reward"] > 0.85  # greedy decoding names the colour
