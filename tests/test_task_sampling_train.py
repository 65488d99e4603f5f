"""Adaptive task sampling through the real training loop: a run resumed from its checkpoint draws
exactly the unbroken run's tasks, in sync and async mode, and two launched ranks merge their
counts into the same weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agilerl.manifest.spec import load_manifest
from tests.test_async_train import ByPlaceInGroup
from tests.test_train_distributed import GRPO, _launch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _train(out: Path, steps: int, mode: str, resume: Path | None = None) -> dict:
    """Guess with a scripted policy (every group informative, outcomes independent of timing),
    adaptive sampling; the task stream in the checkpoint of step ``steps``."""
    from agilerl.assembly.models import load_model_and_tokenizer
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.train.loops import train_llm_rollout

    manifest = load_manifest(EXAMPLES / "guess" / "manifest.yaml")
    training = manifest.training.model_copy(update={
        "batch_size": 2, "group_size": 2, "max_steps": steps, "evaluation_interval": 0, "checkpoint_interval": 2,
        "task_sampling": "adaptive", "rollout_mode": mode, "output_dir": str(out),
        **({"max_staleness": 0} if mode == "async" else {}),
    })
    model, tokenizer = load_model_and_tokenizer(manifest.model, seed=training.seed, checkpoint=resume)
    with RolloutCollector.from_spec(
        manifest.environment, tokenizer, base_dir=manifest.base_dir, seed=training.seed,
        batch_size=2, group_size=2, max_turns=1,
    ) as collector:
        train_llm_rollout(model, tokenizer, collector, "grpo", training, show_progress=False,
                          resume_from=resume, generation=ByPlaceInGroup(tokenizer, 2))
    state = json.loads((out / "checkpoints" / f"step-{steps:06d}" / "trainer_state.json").read_text())
    return state["rollout"][0]["tasks"]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_resumed_adaptive_run_draws_what_the_unbroken_run_drew(tmp_path, mode):
    unbroken = _train(tmp_path / "unbroken", 4, mode)
    _train(tmp_path / "resumed", 2, mode)
    resumed = _train(tmp_path / "resumed", 4, mode, resume=tmp_path / "resumed" / "checkpoints" / "step-000002")
    assert resumed["sampling"] == "adaptive" and len(unbroken["outcomes"]) > 1
    trained = 4 * 2
    assert resumed["handed"][:trained] == unbroken["handed"][:trained]  # the tasks of all four steps
    if mode == "sync":  # in async the lanes run ahead by timing; the trained prefix is what must agree
        assert resumed == unbroken


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_launched_ranks_merge_their_counts(tmp_path):
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        GRPO.replace("MODEL", "{name_or_path: tiny}").replace("seed: 0}", "seed: 0, task_sampling: adaptive}")
    )
    out = tmp_path / "run"
    _launch("ddp", manifest, out)
    ranks = json.loads((out / "checkpoints" / "step-000002" / "trainer_state.json").read_text())["rollout"]
    streams = [rank["tasks"] for rank in ranks]
    assert len(streams) == 2 and all(s["sampling"] == "adaptive" for s in streams)
    assert streams[0]["handed"] != streams[1]["handed"]  # each rank draws its own tasks
    assert streams[0]["outcomes"] == streams[1]["outcomes"]  # and counts every rank's groups
    seen = sum(seen for _, seen, _ in streams[0]["outcomes"])
    assert seen >= 2 * 2  # two steps of a group from each rank at least (lost groups aside)
