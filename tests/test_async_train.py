"""Async training through the real loop: the lag-0 step equals the sync step, a resumed run
trains each task once, the main job learns, and two ranks (DDP, FSDP2) train asynchronously."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agilerl.manifest.spec import load_manifest
from agilerl.generation.policy import Generation
from tests.test_train_distributed import GRPO, _launch, _rows

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


class ByPlaceInGroup:
    """A deterministic policy: the i-th prompt of a call answers ``REPLIES[i % group_size]``, so
    a group's rollouts differ (their rewards too) and the answer never depends on which other
    groups share the call (every group's prompts arrive together, in sync and async alike)."""

    REPLIES = ("5", "7", "9", "x")

    def __init__(self, tokenizer, group_size):
        self.tokenizer, self.group_size = tokenizer, group_size

    def generate(self, prompts, params):
        stop = list(params.stop_token_ids[:1])
        out = []
        for i, _ in enumerate(prompts):
            text = self.REPLIES[i % self.group_size % len(self.REPLIES)]
            out.append(Generation(self.tokenizer.encode(text, add_special_tokens=False) + stop, None, "stop"))
        return out


def _one_step(tmp_path, mode):
    from agilerl.assembly.models import load_model_and_tokenizer
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.train.loops import train_llm_rollout

    manifest = load_manifest(EXAMPLES / "guess" / "manifest.yaml")
    training = manifest.training.model_copy(update={
        "batch_size": 4, "group_size": 4, "max_steps": 1, "evaluation_interval": 0, "rollout_mode": mode,
        "output_dir": str(tmp_path / mode), **({"max_staleness": 0} if mode == "async" else {}),
    })
    model, tokenizer = load_model_and_tokenizer(manifest.model, seed=training.seed)
    with RolloutCollector.from_spec(
        manifest.environment, tokenizer, base_dir=manifest.base_dir, seed=training.seed,
        batch_size=4, group_size=4, max_turns=1,
    ) as collector:
        result = train_llm_rollout(
            model, tokenizer, collector, "grpo", training, show_progress=False,
            generation=ByPlaceInGroup(tokenizer, 4),
        )
    return result, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_at_max_staleness_0_an_async_step_equals_the_sync_step(tmp_path):
    """The same tasks and weights: the same loss, and the same update of every weight (Adam's
    first step moves a weight by about lr * sign(gradient): any gradient that differed shows)."""
    import torch

    sync, sync_weights = _one_step(tmp_path, "sync")
    lagged, async_weights = _one_step(tmp_path, "async")
    assert sync.metrics["train/loss"] != 0.0  # the groups' rewards differ: there is a gradient
    assert lagged.metrics["train/loss"] == pytest.approx(sync.metrics["train/loss"], rel=1e-5, abs=1e-7)
    assert lagged.metrics["algo/grad_norm"] == pytest.approx(sync.metrics["algo/grad_norm"], rel=1e-5)
    assert lagged.metrics["rollout/staleness_max"] == 0.0
    for name, weight in sync_weights.items():
        torch.testing.assert_close(async_weights[name], weight, rtol=0, atol=3e-4 * 0.1)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_async_run_resumed_trains_every_task_once(tmp_path):
    """2 steps, saved (the groups in flight are dropped), resumed to 4: the checkpoints' task
    streams show 4 x batch_size distinct tasks trained, none twice, none skipped."""
    from agilerl.cli.main import main

    out = tmp_path / "run"

    def manifest(steps: int) -> str:
        path = tmp_path / f"m{steps}.yaml"
        path.write_text(
            (EXAMPLES / "guess" / "manifest.yaml").read_text()
            .replace("max_steps: 100", f"max_steps: {steps}\n  rollout_mode: async\n  max_staleness: 1\n  output_dir: {out}")
            .replace("evaluation_interval: 10", "evaluation_interval: 0")
        )
        return str(path)

    assert main(["train", manifest(2), "--no-progress"]) == 0
    first = json.loads((out / "checkpoints" / "step-000002" / "trainer_state.json").read_text())["rollout"][0]
    assert first["taken"] == 16
    assert main(["train", manifest(4), "--no-progress", "--resume"]) == 0
    final = json.loads((out / "checkpoints" / "step-000004" / "trainer_state.json").read_text())["rollout"][0]
    assert final["taken"] == 32
    trained = set(range(final["trained_below"])) | set(final["trained"])
    assert len(trained) == 32  # 32 groups trained, each on its own task number: none twice
    earlier = set(range(first["trained_below"])) | set(first["trained"])
    assert earlier <= trained
    assert final["trained_below"] >= max(earlier)  # every task drawn before the save was trained since
    assert [r["step"] for r in _rows(out)] == [1, 2, 3, 4]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_grpo_learns_the_guess_example_in_async_mode(tmp_path):
    """The main job's task is learnt in async mode: greedy decoding answers 7, or the sampled
    reward climbs from chance past 0.5. Which weights generate which samples depends on the host's timing (the lanes' calls
    share batches in arrival order), so the path does too, and greedy decoding does not always
    follow: most runs answer 7 greedily by steps 50-70 (``stop_at_eval_reward`` then ends them),
    but on a loaded host one run in about five settles where three sampled tokens mix a filler
    token with 7 (``"\\x1f\\x1f7"``: the env reads 7, reward 1.0), paying 0.8 sampled while greedy
    decoding picks the filler everywhere (reward 0, for 300 steps). Sync mode's seeded run is
    exact and is held to greedy 1.0 (tests/test_train_learning.py)."""
    from agilerl.assembly.models import load_model_and_tokenizer
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.generation.policy import SamplingParams
    from agilerl.train.loops import train_llm_rollout
    from agilerl.train.metrics import read_metrics

    manifest = load_manifest(EXAMPLES / "guess" / "manifest.yaml")
    training = manifest.training.model_copy(update={
        "max_steps": 100, "evaluation_interval": 10, "output_dir": str(tmp_path),
        "rollout_mode": "async", "max_staleness": 1, "stop_at_eval_reward": 1.0,
    })
    model, tokenizer = load_model_and_tokenizer(manifest.model, seed=training.seed)
    with RolloutCollector.from_spec(
        manifest.environment, tokenizer, base_dir=manifest.base_dir, seed=training.seed,
        batch_size=training.batch_size, group_size=training.group_size,
        sampling=SamplingParams(max_new_tokens=training.max_new_tokens),
    ) as collector:
        result = train_llm_rollout(model, tokenizer, collector, "grpo", training, show_progress=False)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    rewards = [r["train/reward"] for r in rows if "train/reward" in r]
    evals = [(r["step"], r["eval/reward"]) for r in rows if "eval/reward" in r]
    windows = [sum(rewards[i : i + 5]) / 5 for i in range(len(rewards) - 4)]
    assert evals[0] == (0, 0.0) and windows[0] < 0.1, (evals, rewards)  # greedy and sampled start at chance
    assert max(windows) > 3 * windows[0], rewards
    assert max(r["rollout/staleness_max"] for r in rows if "train/reward" in r) <= 1
    if evals[-1][1] == 1.0:  # solved greedily: the run ended at that evaluation, saved
        assert result.step == evals[-1][0] and all(reward < 1.0 for _, reward in evals[:-1])
    else:  # the filler mode: sampling pays, greedy does not
        assert result.step == 100 and max(windows) > 0.5, (evals, rewards)
    assert result.checkpoint is not None and result.checkpoint.name == f"step-{result.step:06d}"


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_two_ranks_train_asynchronously_each_with_its_own_pipeline(tmp_path, engine):
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        GRPO.replace("MODEL", "{name_or_path: tiny}").replace("seed: 0}", "seed: 0, rollout_mode: async, max_staleness: 1}")
    )
    out = tmp_path / "run"
    _launch(engine, manifest, out)
    rows = _rows(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["rollout/staleness_max"] <= 1 for r in rows[1:])
    state = json.loads((out / "checkpoints" / "step-000002" / "trainer_state.json").read_text())
    assert [s["taken"] for s in state["rollout"]] == [4, 4]  # one pipeline per rank, 2 groups a step each


def test_eval_results_carry_the_version_of_every_generated_token(tmp_path):
    from agilerl.cli.main import main

    out = tmp_path / "eval.jsonl"
    assert main(["eval", "guess", "--model", "tiny", "--max-new-tokens", "4", "--no-progress", "-n", "2", "--output", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert row["versions"] and set(row["versions"]) == {0}  # one per generated token: one set of weights


def test_max_staleness_without_async_is_refused_naming_the_fix():
    from pydantic import ValidationError

    from agilerl.manifest.settings import TrainingSettings

    with pytest.raises(ValidationError, match="max_staleness=3 applies to rollout_mode: async only.*set rollout_mode: async"):
        TrainingSettings(max_staleness=3)
    with pytest.raises(ValidationError, match="max_staleness=1 applies to rollout_mode: async only"):
        TrainingSettings(max_staleness=1)  # the default written out is still a setting sync ignores
    assert TrainingSettings(rollout_mode="async", max_staleness=0).max_staleness == 0
    with pytest.raises(ValidationError, match="max_staleness"):
        TrainingSettings(rollout_mode="async", max_staleness=-1)


def test_async_on_a_dataset_env_is_refused_naming_the_fix(tmp_path):
    from agilerl.assembly.models import load_model_and_tokenizer
    from agilerl.data.dataset_env import DatasetEnv
    from agilerl.errors import InvalidArgument
    from agilerl.train.loops import train_llm_dataset

    manifest = load_manifest(EXAMPLES / "sft" / "manifest.yaml")
    model, tokenizer = load_model_and_tokenizer(manifest.model)
    dataset = DatasetEnv.from_spec(manifest.environment, tokenizer, base_dir=manifest.base_dir, batch_size=2)
    training = {"rollout_mode": "async", "output_dir": str(tmp_path)}
    with pytest.raises(InvalidArgument, match="rollout_mode: async applies to rollout envs.*remove rollout_mode"):
        train_llm_dataset(model, tokenizer, dataset, "sft", training, show_progress=False)
