"""``training.report_to``: the trackers get what ``metrics.jsonl`` gets, read back from what they
wrote (TensorBoard's event files, trackio's local store); a resumed run continues the same run;
a tracker's missing package is one line and exit 2; a plugin adds a tracker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from agilerl.cli.main import main
from agilerl.train.metrics import read_metrics

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
GUESS = {"env_type": "rollout", "entrypoint": "guess", "env_config": {"target": 7}, "max_turns": 2}
SMALL = {"batch_size": 2, "group_size": 2, "max_new_tokens": 2, "evaluation_interval": 1, "eval_episodes": 1}


def _manifest(tmp_path: Path, **training) -> Path:
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump({"environment": GUESS, "training": {**SMALL, **training}}))
    return path


def _logged_rows(output_dir: Path) -> dict[int, dict[str, float]]:
    """``metrics.jsonl`` as a tracker should have it: per step, every metric with a value."""
    rows = {}
    for record in read_metrics(output_dir / "metrics.jsonl"):
        values = {k: v for k, v in record.items() if k not in ("step", "engine") and v is not None}
        rows[record["step"]] = values
    return rows


def _tensorboard_rows(log_dir: Path) -> dict[int, dict[str, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows: dict[int, dict[str, float]] = {}
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            rows.setdefault(event.step, {})[tag] = event.value
    return rows


def _train(manifest: Path, out: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    """``agilerl train`` in its own process: trackio reads ``TRACKIO_DIR`` when it is imported."""
    cmd = [sys.executable, "-m", "agilerl", "train", str(manifest), "--output-dir", str(out), "--no-progress", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def _trackio_runs(env: dict[str, str], project: str) -> dict[str, list[dict]]:
    code = textwrap.dedent(
        f"""
        import json
        from trackio.sqlite_storage import SQLiteStorage
        runs = SQLiteStorage.get_runs({project!r})
        print(json.dumps({{run: SQLiteStorage.get_logs({project!r}, run) for run in runs}}))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two `agilerl train` processes: 20 s on a busy host
def test_tensorboard_and_trackio_get_the_metrics_rows_and_a_resume_continues_the_run(tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("trackio")
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")}
    manifest = _manifest(
        tmp_path, report_to=["tensorboard", "trackio"], project="tour", run_name="guess-run", checkpoint_interval=2
    )
    out = tmp_path / "run"
    first = _train(manifest, out, env, "--max-steps", "3")
    assert first.returncode == 0, first.stderr
    # from step 2, so step 3 is trained and logged again: metrics.jsonl and TensorBoard drop the first one
    resumed = _train(manifest, out, env, "--max-steps", "3", "--resume", str(out / "checkpoints" / "step-000002"))
    assert resumed.returncode == 0, resumed.stderr
    assert "step 3/3  reward" in first.stderr  # --no-progress: plain lines instead of the bar
    assert "Removed shared tensor" not in first.stderr + resumed.stderr  # the tied lm_head is expected

    expected = _logged_rows(out)
    assert sorted(expected) == [0, 1, 2, 3] and "eval/reward" in expected[3] and "time/step_s" in expected[1]
    tensorboard = _tensorboard_rows(out / "tensorboard")
    assert sorted(tensorboard) == sorted(expected)
    for step, values in expected.items():
        assert tensorboard[step] == pytest.approx(values, rel=1e-5), step  # same keys, same values

    runs = _trackio_runs(env, "tour")
    assert list(runs) == ["guess-run"]  # one run: the resume continued it
    # trackio keeps both step-3 rows, in order: the resumed run's is the one metrics.jsonl has
    logged = {row["step"]: {k: v for k, v in row.items() if k not in ("step", "timestamp")} for row in runs["guess-run"]}
    assert sorted(logged) == sorted(expected)
    for step, values in expected.items():
        assert logged[step] == pytest.approx(values, rel=1e-9), step


def test_a_tracker_without_its_package_exits_2_in_one_line_naming_it(tmp_path, capsys, monkeypatch):
    # A None entry in sys.modules is how Python marks a module unimportable: wandb reads as not
    # installed here whether or not it is, so the test runs on every machine.
    monkeypatch.setitem(sys.modules, "wandb", None)
    out = tmp_path / "run"
    code = main(["train", str(_manifest(tmp_path, report_to=["wandb"])), "--output-dir", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines() == [
        "error: training.report_to 'wandb' needs the 'wandb' package, which is not installed: pip install wandb"
    ]
    assert not (out / "metrics.jsonl").exists()  # nothing trained


def test_a_plugin_tracker_gets_the_run_its_config_and_every_row(tmp_path, monkeypatch):
    from agilerl.assembly.from_manifest import train_from_manifest
    from agilerl.manifest.spec import parse_manifest
    from agilerl.registry import get_plugin_manager

    (tmp_path / "my_tracker.py").write_text(textwrap.dedent(
        """
        from accelerate.tracking import GeneralTracker
        from agilerl import hookimpl

        class ListTracker(GeneralTracker):
            name = "list"
            requires_logging_directory = False
            seen = {}

            def __init__(self, run):
                super().__init__()
                self.seen.update(run=run, rows=[], finished=False)

            @property
            def tracker(self):
                return self.seen

            def store_init_configuration(self, values):
                self.seen["config"] = values

            def log(self, values, step=None, **kwargs):
                self.seen["rows"].append((step, values))

            def finish(self):
                self.seen["finished"] = True

        @hookimpl
        def register_trackers(register):
            register("list", ListTracker, description="keeps rows in memory")
        """
    ))
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_tracker

    pm = get_plugin_manager()
    pm.register(my_tracker, name="my_tracker")
    try:
        manifest = parse_manifest(
            {"environment": GUESS, "training": {**SMALL, "max_steps": 2, "report_to": "list",
                                                "output_dir": str(tmp_path / "run")}},
            base_dir=EXAMPLES / "guess",
        )
        train_from_manifest(manifest, show_progress=False)
    finally:
        pm.unregister(my_tracker)
    seen = my_tracker.ListTracker.seen
    assert (seen["run"].project, seen["run"].name, seen["run"].start_step) == ("agilerl", "run", 0)
    assert seen["config"]["training.max_steps"] == 2 and seen["config"]["algorithm.class"] == "GRPO"
    assert seen["config"]["training.report_to"] == '["list"]'
    assert seen["config"]["engine"].startswith("accelerate single process")
    assert dict(seen["rows"]) == _logged_rows(tmp_path / "run")
    assert seen["finished"]


def test_manifest_validate_names_a_misspelt_tracker(tmp_path, capsys):
    assert main(["manifest", "validate", str(_manifest(tmp_path, report_to=["tensorbord"]))]) == 2
    assert "training.report_to: no tracker named 'tensorbord' is registered. Did you mean 'tensorboard'" in capsys.readouterr().err
