"""Nothing done is lost: SIGKILL at random points during training, checkpoint and metrics writes;
a run that fails or is sent SIGTERM keeps its last whole step and says how to resume; a torn
metrics line is dropped, a rewrite is atomic, old checkpoints are rotated."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agilerl.cli.main import main
from agilerl.errors import CheckpointError
from agilerl.train.metrics import MetricsLog, read_metrics
from tests.signals import as_from_a_terminal

SFT = Path(__file__).resolve().parents[1] / "examples" / "sft"
SEED = int(os.environ.get("AGILERL_FAULT_SEED", time.time_ns() % 100_000))
"""The random kill points; a failure names it, AGILERL_FAULT_SEED=N replays it."""


def _sft_run(tmp_path: Path, **training: object) -> Path:
    """The SFT example with ``training`` changed, in its own folder."""
    folder = tmp_path / "sft"
    folder.mkdir(exist_ok=True)
    shutil.copy(SFT / "data.jsonl", folder / "data.jsonl")
    manifest = yaml.safe_load((SFT / "manifest.yaml").read_text())
    manifest["training"].update(evaluation_interval=0, **training)
    (folder / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    return folder / "manifest.yaml"


def _steps(out: Path) -> list[int]:
    return [row["step"] for row in read_metrics(out / "metrics.jsonl")]


def _wait_for(predicate, what: str, process: subprocess.Popen | None = None, bound_s: float = 240) -> None:
    """Poll ``predicate`` (bounded); a process that ended first fails the wait at once."""
    deadline = time.monotonic() + bound_s
    while not predicate():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the process ended (rc {process.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {bound_s} s")
        time.sleep(0.02)


STALLED_SAVE = """
import sys, time
from pathlib import Path
from agilerl.cli.main import main
stalled = f"step-{int(sys.argv[1]):06d}.partial"
real_rename = Path.rename


def rename(self, target):  # that checkpoint is whole on disk but not yet in place: kill here
    if self.name == stalled:
        print("saving", flush=True)
        time.sleep(600)
    return real_rename(self, target)


Path.rename = rename
sys.exit(main(sys.argv[2:]))
"""


def test_sigkill_at_random_points_loses_and_duplicates_no_row(tmp_path):
    """SIGKILL while a random step's checkpoint is written, SIGTERM at a random moment of the
    resumed run (collection, update, the row's write, a checkpoint's), then resumed to the end:
    every step's row is there exactly once, and only the newest checkpoints are kept."""
    rng = random.Random(SEED)
    max_steps = 7
    manifest = _sft_run(tmp_path, max_steps=max_steps, checkpoint_interval=1, keep_last=2)
    out = tmp_path / "out"
    args = ["train", str(manifest), "--output-dir", str(out), "--no-progress"]
    stalled = rng.randint(2, 3)
    killed = subprocess.Popen([sys.executable, "-c", STALLED_SAVE, str(stalled), *args], stdout=subprocess.PIPE, text=True)
    try:
        assert killed.stdout is not None and "saving\n" in iter(killed.stdout.readline, "")
    finally:
        killed.kill()
        killed.wait(timeout=60)
    assert (out / "checkpoints" / f"step-{stalled:06d}.partial").is_dir(), f"seed {SEED}"
    assert _steps(out) == list(range(1, stalled + 1)), f"seed {SEED}"  # the row comes before its checkpoint

    base = [sys.executable, "-m", "agilerl", *args]
    resumed = subprocess.Popen(
        [*base, "--resume"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_from_a_terminal
    )
    try:
        _wait_for(lambda: len(_steps(out)) > stalled, "a row after the resume", resumed)
        time.sleep(rng.uniform(0, 0.4))  # somewhere in the next step(s), their rows and checkpoints
        resumed.send_signal(signal.SIGTERM)
        stdout, stderr = resumed.communicate(timeout=240)
    finally:
        resumed.kill()
    steps = _steps(out)
    # 130: stopped and saved; 0 or -15: the run had finished (and saved) before the signal came
    assert resumed.returncode == 130 or steps[-1] == max_steps, f"seed {SEED}: {resumed.returncode} {stderr}"
    if resumed.returncode == 130:
        assert f"resume with: agilerl train {manifest} --output-dir {out} --no-progress --resume" in stdout, stdout
    assert steps == list(range(1, len(steps) + 1)), f"seed {SEED}: rows {steps}"

    final = subprocess.run([*base, "--resume"], capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, f"seed {SEED}: {final.stderr}"
    assert _steps(out) == list(range(1, max_steps + 1)), f"seed {SEED}"
    kept = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert kept == [f"step-{max_steps - 1:06d}", f"step-{max_steps:06d}"], kept  # rotated, no .partial left


REWRITER = """
import io, sys, time
from pathlib import Path
from agilerl.train.metrics import MetricsLog, replace_file
out, cut = Path(sys.argv[1]), float(sys.argv[2])
full = (out / "full.jsonl").read_text()
if cut:  # the next big write stops part-way (at `cut` of its text) until the kill
    real_open = io.open

    class Stalls:
        def __init__(self, f):
            self.f = f
        def write(self, text):
            if len(text) > 100_000:
                self.f.write(text[: int(len(text) * cut)])
                self.f.flush()
                print("mid-write", flush=True)
                time.sleep(600)
            return self.f.write(text)
        def __getattr__(self, name):
            return getattr(self.f, name)
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    def stalling_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return Stalls(f) if "w" in mode and str(file).startswith(str(out)) else f

    io.open = stalling_open
print("ready", flush=True)
while True:  # a resume's rewrite (40,000 rows -> 20,000), and back, until killed
    MetricsLog(out, start_step=20_000)
    replace_file(out / "metrics.jsonl", full)
"""


@pytest.mark.parametrize("where", ["anywhere", "mid-write"])
def test_sigkill_during_the_resume_rewrite_of_metrics_leaves_the_old_or_the_new_history(tmp_path, where):
    """Killed at random moments of rewrites (or part-way through writing the text, at a random
    point of it): metrics.jsonl is the old 40,000-row history or the new 20,000, never less."""
    rng = random.Random(SEED)
    rows = "".join(json.dumps({"step": step, "train/loss": 1.0 / step}) + "\n" for step in range(1, 40_001))
    (tmp_path / "full.jsonl").write_text(rows)
    (tmp_path / "metrics.jsonl").write_text(rows)
    for _ in range(3):
        cut = rng.uniform(0.05, 0.95) if where == "mid-write" else 0
        process = subprocess.Popen(
            [sys.executable, "-c", REWRITER, str(tmp_path), str(cut)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert process.stdout is not None and process.stdout.readline() == "ready\n"
            if cut:
                assert process.stdout.readline() == "mid-write\n"
            else:
                time.sleep(rng.uniform(0.01, 0.3))
        finally:
            process.kill()
            process.wait(timeout=60)
        steps = _steps(tmp_path)
        assert steps in (list(range(1, 40_001)), list(range(1, 20_001))), f"seed {SEED}: {len(steps)} rows"


def test_a_torn_last_line_is_dropped_with_a_warning_and_a_damaged_one_is_named(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "train/lo')
    log = MetricsLog(tmp_path, start_step=3)
    assert "dropped its torn last line" in capsys.readouterr().err
    log.write(4, {"train/loss": 0.5})
    assert _steps(tmp_path) == [1, 2, 3, 4]

    path.write_text('{"step": 1}\n{"step": 2, "tr\n{"step": 3}\n')
    with pytest.raises(CheckpointError, match="line 2 is not JSON"):
        MetricsLog(tmp_path, start_step=3)
    assert path.read_text() == '{"step": 1}\n{"step": 2, "tr\n{"step": 3}\n'  # left as it was


FAILING_ENV = '''
from pathlib import Path


class FailingEnv:
    """Works for eight episodes, then every reset raises (its backing service went away)."""

    max_turns = 1

    def __init__(self, log):
        self.log = Path(log)

    def reset(self, seed=None):
        with self.log.open("a") as f:
            f.write("reset\\n")
        if len(self.log.read_text().splitlines()) > 8:
            raise RuntimeError("the env's backing service is gone")
        return "Say hi.", {}

    def step(self, action):
        return "", 1.0, True, False, {}
'''


def test_a_run_that_fails_saves_its_last_whole_step_and_prints_the_resume_command(tmp_path, capsys):
    (tmp_path / "env.py").write_text(FAILING_ENV)
    resets = tmp_path / "resets.log"
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(yaml.safe_dump({
        "environment": {"env_type": "rollout", "entrypoint": "env.py:FailingEnv", "env_config": {"log": str(resets)}},
        "training": {"max_steps": 4, "batch_size": 2, "group_size": 2, "max_new_tokens": 2,
                     "evaluation_interval": 0, "checkpoint_minutes": None},
    }))
    out = tmp_path / "out"
    args = ["train", str(manifest), "--output-dir", str(out), "--no-progress"]
    assert main(args) == 2  # 4 resets a step: steps 1 and 2 train, step 3's collection fails
    err = capsys.readouterr().err
    assert "the env's backing service is gone" in err
    assert f"the last whole step, 2, is saved in {out / 'checkpoints' / 'step-000002'}" in err
    assert f"resume with: agilerl train {manifest} --output-dir {out} --no-progress --resume" in err
    assert _steps(out) == [1, 2]

    resets.unlink()  # the service is back: the printed command continues the run
    assert main([*args, "--resume"]) == 0
    assert _steps(out) == [1, 2, 3, 4]


def test_checkpoint_minutes_bounds_lost_work_and_keep_last_rotates(tmp_path, capsys):
    manifest = _sft_run(tmp_path, max_steps=4, checkpoint_interval=0, checkpoint_minutes=1e-9, keep_last=2)
    out = tmp_path / "out"
    assert main(["train", str(manifest), "--output-dir", str(out), "--no-progress"]) == 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000003", "step-000004"]


def test_an_evaluation_that_fails_after_the_update_keeps_the_step_its_row_and_its_checkpoint(tmp_path):
    from agilerl.assembly.models import load_model_and_tokenizer
    from agilerl.data.dataset_env import DatasetEnv
    from agilerl.manifest.spec import load_manifest
    from agilerl.train.loops import train_llm_dataset

    class HeldOutGoesAway(DatasetEnv):
        """The held-out split reads once (the baseline), then its storage is gone."""

        evaluations = 0

        def batches(self, epoch=0, *, evaluation=False):
            if evaluation:
                HeldOutGoesAway.evaluations += 1
                if HeldOutGoesAway.evaluations > 1:
                    raise OSError("the held-out shard's disk went away")
            return super().batches(epoch, evaluation=evaluation)

    manifest = load_manifest(SFT / "manifest.yaml")
    model, tokenizer = load_model_and_tokenizer(manifest.model)
    dataset = HeldOutGoesAway.from_spec(manifest.environment, tokenizer, base_dir=manifest.base_dir, batch_size=4)
    out = tmp_path / "out"
    settings = {"max_steps": 4, "evaluation_interval": 2, "output_dir": str(out), "lr": 1e-4}
    with pytest.raises(OSError, match="disk went away") as info:
        train_llm_dataset(model, tokenizer, dataset, "sft", settings, show_progress=False)
    assert _steps(out) == [0, 1, 2]  # step 2's row, without the evaluation that failed
    assert (out / "checkpoints" / "step-000002" / "trainer_state.json").is_file()
    assert f"the last whole step, 2, is saved in {out / 'checkpoints' / 'step-000002'}" in info.value.__notes__[0]
