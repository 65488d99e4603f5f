"""bench/async_rollout.py still runs, at its smallest size, and prints the lines bench/README.md
quotes (no timing asserted)."""

from __future__ import annotations

import pytest

from tests.test_bench import RATIO, assert_lines, run_bench


@pytest.mark.timeout(900)
def test_async_rollout_reports_both_modes_and_their_ratio(tmp_path):
    out = run_bench(
        "async_rollout.py", "--cases", "a,b", "--steps", "1", "--max-staleness", "0,1", "--plot", str(tmp_path / "fig.png")
    )
    for case in ("slow turns", "long tail"):
        assert_lines(out, rf"^\(\w\) {case}.*: sync +\d+ steps/h", rf"^\(\w\) {case}.*: async-1 +\d+ steps/h")
        assert_lines(out, rf"^\(\w\) {case}.*: async \(max_staleness 0\)/sync {RATIO} \(goal >= \d\.\dx\)$")
    assert (tmp_path / "fig.png").stat().st_size > 0
