"""tiny-vlm learns the colors env (examples/colors) above chance within a bounded number of steps.

The question is the same every episode: only a model that looks at the square beats chance (half
the episodes, with two colours). Bounded by steps, not the clock; the timeout only catches a hang."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_train_learning import train_example

pytestmark = pytest.mark.slow


@pytest.mark.timeout(2400)
def test_grpo_teaches_the_tiny_vlm_to_name_the_colour(tmp_path: Path) -> None:
    result, records, rewards = train_example("colors", 50, tmp_path)

    # a correct answer scores 1, a wrong digit 0.2: a model blind to the picture averages 0.6 at best
    assert records[0]["eval/reward"] < 0.7
    assert sum(rewards[:5]) / 5 < 0.3  # sampling starts far below even that
    assert sum(rewards[-5:]) / 5 > 0.85, rewards  # it looks at the square
    assert result.metrics["eval/reward"] > 0.85  # greedy decoding names the colour
