"""A seeded CPU run repeats its metrics exactly, on torch's default of several threads: the main
job's manifest (GRPO on guess-the-number, every row of a group sharing its prompt's cached
prefix), run twice at once as two real ``agilerl train`` processes on 2 torch threads each. The
shared prefix's backward (an advanced index) summed its gradients in the threads' timing order;
the run now uses torch's deterministic algorithms on CPUs (agilerl/train/determinism.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agilerl.train.metrics import read_metrics

GUESS = Path(__file__).resolve().parents[1] / "examples" / "guess" / "manifest.yaml"
WALL_CLOCK = ("time/", "_time_s", "_per_s", "wait_s")  # what a clock measured, not what was computed


def _computed(row: dict) -> dict:
    return {key: value for key, value in row.items() if not any(mark in key for mark in WALL_CLOCK)}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_seeded_cpu_runs_on_two_threads_give_the_same_metrics(tmp_path: Path) -> None:
    manifest = yaml.safe_load(GUESS.read_text())
    manifest["training"].update(max_steps=2, evaluation_interval=0, checkpoint_minutes=None)
    (tmp_path / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    # tests/conftest.py gives each test worker one torch thread; the race needs two or more
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "agilerl", "train", str(tmp_path / "manifest.yaml"), "--output-dir",
             str(tmp_path / f"run{i}"), "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for i in (0, 1)
    ]
    try:
        outputs = [run.communicate(timeout=540) for run in runs]
    finally:
        for run in runs:
            run.kill()
    assert [run.returncode for run in runs] == [0, 0], outputs
    first, second = ([_computed(row) for row in read_metrics(tmp_path / f"run{i}" / "metrics.jsonl")] for i in (0, 1))
    assert [row["step"] for row in first] == [1, 2] and all("algo/loss" in row for row in first)
    assert first == second


def test_deterministic_algorithms_by_device_and_setting_and_put_back(monkeypatch) -> None:
    import torch

    from agilerl.train.determinism import CUBLAS_WORKSPACE, deterministic_algorithms

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    for setting, device, on, strict in ((None, "cpu", True, False), (None, "cuda", False, False),
                                        (True, "cuda", True, True), (False, "cpu", False, False)):
        with deterministic_algorithms(setting, torch.device(device)) as enabled:
            assert enabled is on and torch.are_deterministic_algorithms_enabled() is on
            assert (on and not torch.is_deterministic_algorithms_warn_only_enabled()) is strict
        assert not torch.are_deterministic_algorithms_enabled()  # as it was
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE  # asked for on a GPU: cuBLAS's too
