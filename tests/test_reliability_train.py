"""What a resume, a second run and a signal can do to a run's folder: a damaged newest checkpoint
is passed over (or named), a checkpoint of another kind of run is refused before anything loads,
two runs never share a folder, and SIGHUP or a burst of Ctrl-C still saves and says how to resume."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agilerl.cli.main import main
from agilerl.train.metrics import read_metrics
from tests.signals import as_from_a_terminal, as_under_nohup

SFT = Path(__file__).resolve().parents[1] / "examples" / "sft"
GUESS = {"env_type": "rollout", "entrypoint": "guess",
         "env_config": {"low": 1, "high": 10, "target": 7, "system_prompt": "Reply with one number."}}


def _sft_manifest(tmp_path: Path, **training: object) -> Path:
    folder = tmp_path / "sft"
    folder.mkdir(exist_ok=True)
    shutil.copy(SFT / "data.jsonl", folder / "data.jsonl")
    manifest = yaml.safe_load((SFT / "manifest.yaml").read_text())
    manifest["training"].update(evaluation_interval=0, checkpoint_minutes=None, **training)
    (folder / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    return folder / "manifest.yaml"


def _steps(out: Path) -> list[int]:
    return [row["step"] for row in read_metrics(out / "metrics.jsonl")]


def _truncate(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


@pytest.mark.slow
def test_resume_passes_over_a_truncated_newest_checkpoint_and_a_named_one_is_refused(tmp_path, capsys):
    manifest = _sft_manifest(tmp_path, checkpoint_interval=1)
    out = tmp_path / "out"
    args = ["train", str(manifest), "--output-dir", str(out), "--no-progress"]
    assert main(args) == 0
    first, newest = out / "checkpoints" / "step-000001", out / "checkpoints" / "step-000002"
    _truncate(newest / "model.safetensors")  # a full disk, a copy cut short
    capsys.readouterr()

    assert main([*args, "--resume", str(newest)]) == 2  # named on its own: an error naming it and the way out
    err = capsys.readouterr().err
    assert f"checkpoint {newest} is damaged (model.safetensors is " in err and "were written" in err
    assert f"--resume {first}" in err and "resume with:" not in err

    state = json.loads((newest / "trainer_state.json").read_text())
    del state["files"]  # a checkpoint from before sizes were recorded: its safetensors header tells
    (newest / "trainer_state.json").write_text(json.dumps(state))
    assert main([*args, "--resume", str(newest)]) == 2
    assert "model.safetensors is truncated" in capsys.readouterr().err

    assert main([*args, "--resume", "--max-steps", "3"]) == 0  # latest: the newest whole one, with a warning
    err = capsys.readouterr().err
    assert f"warning: checkpoint {newest} is damaged" in err and f"resuming from the newest whole one, {first}" in err
    assert _steps(out) == [1, 2, 3]  # step 2 trained again from step 1
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000001", "step-000002", "step-000003"]


@pytest.mark.slow
def test_resume_after_switching_to_lora_or_another_algorithm_names_the_change(tmp_path, capsys):
    manifest = tmp_path / "m.yaml"
    run = {"environment": GUESS, "algorithm": {"name": "grpo"},
           "training": {"max_steps": 1, "batch_size": 2, "group_size": 2, "max_new_tokens": 2,
                        "evaluation_interval": 0, "checkpoint_minutes": None}}
    manifest.write_text(yaml.safe_dump(run))
    out = tmp_path / "out"
    args = ["train", str(manifest), "--output-dir", str(out), "--no-progress", "--resume", "--max-steps", "2"]
    assert main(args[:-3]) == 0
    saved = out / "checkpoints" / "step-000001"
    capsys.readouterr()

    for change, said in ((["algorithm", {"name": "llmppo"}], "the algorithm is LLMPPO, the checkpoint's is GRPO"),
                         (["model", {"name_or_path": "tiny", "lora": {"r": 4}}],
                          "the model trains LoRA adapters, the checkpoint holds full weights")):
        manifest.write_text(yaml.safe_dump({**run, change[0]: change[1]}))
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"cannot resume from {saved}: {said}" in err
        assert "switch the manifest back, or start fresh" in err and "new output_dir" in err
        assert "resume with:" not in err  # the same command would fail the same way
    assert _steps(out) == [1]  # nothing written


def _popen(manifest: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agilerl", "train", str(manifest), "--output-dir", str(out), "--no-progress", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_from_a_terminal,
    )


def _wait_for_rows(out: Path, process: subprocess.Popen[str], rows: int = 1, bound_s: float = 240) -> None:
    deadline = time.monotonic() + bound_s
    while not ((out / "metrics.jsonl").is_file() and len(_steps(out)) >= rows):
        assert process.poll() is None, f"the run ended (rc {process.returncode}) before its row: {process.stderr.read()}"
        assert time.monotonic() < deadline, f"no row within {bound_s} s"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_second_run_on_a_busy_output_dir_is_refused_and_sighup_saves(tmp_path):
    """A running `agilerl train` holds its folder: a fresh run and a --resume beside it exit 2
    naming the folder and the holder's pid, and write nothing. SIGHUP (the terminal closed)
    then stops the first as Ctrl-C does: it saves and prints the resume command."""
    manifest = _sft_manifest(tmp_path, max_steps=10_000)
    out = tmp_path / "out"
    first = _popen(manifest, out)
    try:
        _wait_for_rows(out, first)
        for extra in ((), ("--resume",), ("--overwrite",)):
            second = subprocess.run(
                [sys.executable, "-m", "agilerl", "train", str(manifest), "--output-dir", str(out), "--no-progress", *extra],
                capture_output=True, text=True, timeout=240,
            )
            assert second.returncode == 2, second.stderr
            assert f"output_dir {out} is in use by another agilerl train (pid {first.pid})" in second.stderr
        first.send_signal(signal.SIGHUP)
        stdout, stderr = first.communicate(timeout=240)
    finally:
        first.kill()
    assert first.returncode == 130, stderr
    step = _steps(out)[-1]
    assert f"checkpoint: {out / 'checkpoints' / f'step-{step:06d}'}" in stdout
    assert f"resume with: agilerl train {manifest} --output-dir {out} --no-progress --resume" in stdout
    assert not (out / ".agilerl-lock").exists()  # released and removed at exit
    assert main(["train", str(manifest), "--output-dir", str(out), "--no-progress", "--resume",
                 "--max-steps", str(step + 1)]) == 0  # the folder is free again


SLOW_TO_BUILD = """
import os, time

class SlowToBuild:
    max_turns = 1

    def __init__(self):
        open(os.environ["AGILERL_TEST_MARKER"], "w").close()
        time.sleep(120)

    def reset(self, seed=None):
        return "hi", {}

    def step(self, action):
        return "", 1.0, True, False, {}
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_during_setup_interrupts_the_command_cleanly(tmp_path, signum):
    """Before the loop (here: while the envs are built), SIGTERM and SIGHUP stop the command as
    Ctrl-C does: what was started is closed (finally blocks run) and it exits 130, saying it was
    interrupted; SIGTERM's default would have killed it on the spot, a fleet's replicas and a Ray
    cluster left to notice alone."""
    (tmp_path / "slow.py").write_text(SLOW_TO_BUILD)
    manifest = tmp_path / "m.yaml"
    manifest.write_text(yaml.safe_dump({
        "environment": {"env_type": "rollout", "entrypoint": "slow.py:SlowToBuild"},
        "model": {"name_or_path": "tiny"}, "algorithm": {"name": "grpo"},
        "training": {"batch_size": 1, "group_size": 2, "max_steps": 1, "max_new_tokens": 2},
    }))
    marker = tmp_path / "building"
    process = subprocess.Popen(
        [sys.executable, "-m", "agilerl", "train", str(manifest), "--output-dir", str(tmp_path / "out"), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_from_a_terminal,
        env={**os.environ, "AGILERL_TEST_MARKER": str(marker)},
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()[-3000:]
            time.sleep(0.05)
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)  # not the env's 120 s
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == "interrupted", stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_under_nohup_sighup_leaves_the_run_going(tmp_path):
    """Started as `nohup agilerl train` does (SIGHUP ignored), a closed terminal does not stop
    the run: it writes further rows, and Ctrl-C still stops and saves it."""
    manifest = _sft_manifest(tmp_path, max_steps=10_000)
    out = tmp_path / "out"
    run = subprocess.Popen(
        [sys.executable, "-m", "agilerl", "train", str(manifest), "--output-dir", str(out), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_under_nohup,
    )
    try:
        _wait_for_rows(out, run)
        run.send_signal(signal.SIGHUP)
        _wait_for_rows(out, run, rows=len(_steps(out)) + 2)  # still training
        run.send_signal(signal.SIGINT)
        stdout, stderr = run.communicate(timeout=240)
    finally:
        run.kill()
    assert run.returncode == 130, stderr
    assert "resume with:" in stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_burst_of_ctrl_c_saves_once_and_prints_the_resume_command(tmp_path):
    manifest = _sft_manifest(tmp_path, max_steps=10_000)
    out = tmp_path / "out"
    run = _popen(manifest, out)
    try:
        _wait_for_rows(out, run)
        deadline = time.monotonic() + 240
        while run.poll() is None and time.monotonic() < deadline:  # Ctrl-C held down, until it ends
            run.send_signal(signal.SIGINT)
            time.sleep(0.02)
        stdout, stderr = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 130, stderr
    words = stdout + stderr
    assert f"resume with: agilerl train {manifest} --output-dir {out} --no-progress --resume" in words, words
    step = _steps(out)[-1]
    saved = out / "checkpoints" / f"step-{step:06d}"
    assert (saved / "trainer_state.json").is_file(), words  # the save on the way out was not cut
    assert not list((out / "checkpoints").glob("*.partial"))
    assert "Traceback" not in stderr


HUGE_REWARDS = '''
class HugeRewards:
    """Every third episode is rewarded 1e308 (a finite float whose sums and squares overflow)."""

    max_turns = 1
    episodes = 0

    def reset(self, seed=None):
        return "Say hi.", {}

    def step(self, action):
        HugeRewards.episodes += 1
        return "", 1e308 if HugeRewards.episodes % 3 == 0 else float(len(action) % 2), True, False, {}
'''


@pytest.mark.slow
def test_a_reward_of_1e308_on_some_steps_loses_those_rollouts_and_the_run_goes_on(tmp_path, capsys):
    """The documented rule (protocol.MAX_ABS_REWARD): a step's reward is a finite number within
    +-1e15, in process and from a server alike; a step breaking it loses its rollout (counted in
    rollout/failures), never the run. It used to end with OverflowError in fsum."""
    (tmp_path / "env.py").write_text(HUGE_REWARDS)
    manifest = tmp_path / "m.yaml"
    manifest.write_text(yaml.safe_dump({
        "environment": {"env_type": "rollout", "entrypoint": "env.py:HugeRewards"},
        "training": {"max_steps": 2, "batch_size": 2, "group_size": 4, "max_new_tokens": 2, "lr": 1e-3,
                     "evaluation_interval": 0, "checkpoint_minutes": None},
    }))
    out = tmp_path / "out"
    assert main(["train", str(manifest), "--output-dir", str(out), "--no-progress"]) == 0, capsys.readouterr().err
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert sum(r["rollout/lost"] for r in rows) >= 2  # every third episode's rollout
    assert all(r["train/loss"] is not None and abs(r["train/reward"]) <= 1 for r in rows)
    from safetensors.torch import load_file

    weights = load_file(out / "checkpoints" / "step-000002" / "model.safetensors")
    assert all(bool(t.isfinite().all()) for t in weights.values())  # nothing non-finite reached them


def test_the_reward_rule_refuses_past_the_bound_and_non_finite_and_takes_the_bound():
    from agilerl.errors import EnvProtocolError
    from agilerl.protocol import MAX_ABS_REWARD, check_step_result

    for reward in (1e308, -1e16, float("inf"), float("nan")):
        with pytest.raises(EnvProtocolError, match="reward must"):
            check_step_result(("", reward, True, False, {}), "env")
    assert check_step_result(("", -MAX_ABS_REWARD, True, False, {}), "env")[1] == -MAX_ABS_REWARD


def test_sys_exit_in_a_rubric_is_that_rubric_s_error():
    import sys as system

    from agilerl.data.rubric import Rubric
    from agilerl.errors import RubricError

    def quits(completion):
        system.exit(3)

    with pytest.raises(RubricError, match=r"rubric 'quits' raised SystemExit: 3 \(on train row 4\)"):
        Rubric.bind(quits, name="quits").score("hi", {}, {}, "train row 4")

    def overflows(completion):
        return {"a": 1e308, "b": 1e308}

    with pytest.raises(RubricError, match="components sum past the largest float on train row 4"):
        Rubric.bind(overflows, name="overflows").score("hi", {}, {}, "train row 4")


def test_sys_exit_in_an_async_rubric_is_its_error_and_the_shared_loop_goes_on():
    import asyncio
    import sys as system

    from agilerl.concurrency import shared_loop
    from agilerl.data.composite import CompositeRubric, RubricEntry
    from agilerl.data.rubric import Rubric
    from agilerl.errors import RubricError

    async def quits(completion):
        system.exit(3)

    async def interrupts():
        raise KeyboardInterrupt

    async def five(completion=None):
        await asyncio.sleep(0)
        return 5.0

    with pytest.raises(RubricError, match=r"rubric 'quits' raised SystemExit: 3 \(on train row 4\)"):
        Rubric.bind(quits, name="quits").score("hi", {}, {}, "train row 4")
    assert shared_loop().submit(five()).result(timeout=5) == 5  # it used to be dead: every call timed out
    together = CompositeRubric([RubricEntry("quits", Rubric.bind(quits)), RubricEntry("five", Rubric.bind(five))])
    with pytest.raises(RubricError, match="raised SystemExit: 3"):  # from a task gathered on the loop
        Rubric.bind(together, name="together").score("hi", {}, {}, "train row 4")
    assert shared_loop().submit(five()).result(timeout=5) == 5.0
    with pytest.raises(KeyboardInterrupt):  # a coroutine's Ctrl-C reaches its caller, the loop survives it
        shared_loop().run(interrupts())
    assert shared_loop().submit(five()).result(timeout=5) == 5.0
