"""Every benchmark under bench/ still runs, at its smallest size, and prints the lines its numbers
in bench/README.md come from.

No timing is asserted (the numbers of a tiny run mean nothing); what is checked is that a
benchmark has not rotted: it starts its servers, runs every setting and reports each ratio.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import urllib.request
import sys
from pathlib import Path

import pytest

from tests.test_remote_openenv import openenv_python  # noqa: F401 - the fixture ws_server.py needs

ROOT = Path(__file__).resolve().parent.parent
RATIO = r"\d+\.\d+x"
# Hang catchers only: a smoke run takes 5-60 s alone on a busy host, but more than 120 s at a load
# average of 12 (torch's two threads fighting the other jobs for two cores).
BENCH_TIMEOUT_S = 600
pytestmark = pytest.mark.timeout(900)


def run_bench(script: str, *args: str, timeout_s: float = BENCH_TIMEOUT_S) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, f"bench/{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def assert_lines(output: str, *patterns: str) -> None:
    for pattern in patterns:
        assert re.search(pattern, output, re.MULTILINE), f"no line matches {pattern!r} in:\n{output}"


def test_collector_reports_every_setting_against_its_ideal_and_its_floor() -> None:
    out = run_bench("collector.py", "--repeats", "1", "--batch-size", "2", "--group-size", "2", "--latency-ms", "2")
    ratio = r"ratio to ideal: \d+\.\d\d"
    assert_lines(
        out,
        rf"^floor: env calls alone, on threads .* {ratio}$",
        rf"^collector, in-process envs .* {ratio} .*ratio to its floor: \d+\.\d\d\)$",
        rf"^floor: bare WebSocket round trips .* {ratio}$",
        rf"^collector, remote envs \(WebSocket\) .* {ratio} .*ratio to its floor: \d+\.\d\d\)$",
        rf"^sequential loop \(4 slots\) .* {ratio}$",
        r"^in-process collector vs sequential loop: \d+\.\dx faster$",
        r"^remote collector vs sequential loop: \d+\.\dx faster$",
    )


def test_harness_turns_reports_first_and_last_turn_costs() -> None:
    out = run_bench("harness_turns.py")
    assert_lines(out, r"^raw baseline", rf"^200 turns: .* last/first {RATIO}, last/raw {RATIO}$")


def test_dataset_env_reports_memory_and_speed_against_raw_rows() -> None:
    out = run_bench("dataset_env.py", "--rows", "2000", "--envs", "4", "--resets", "200")
    assert_lines(out, r"^memory, RSS: .* -> \d+\.\d+x$", r"^each extra env: ", r"^reset \+ step .*baseline\)$")


def test_agent_calls_reports_the_endpoint_overhead_against_direct_calls() -> None:
    out = run_bench("agent_calls.py", "--calls", "2", "--repeats", "1", "--programs", "1", "2", "--max-new-tokens", "2")
    assert_lines(out, r"^floor: the endpoint alone .* median \d+\.\d+ ms, best \d+\.\d+ ms$")
    for programs in (1, 2):
        assert_lines(out, rf"^programs +{programs}: per call .* direct \d+\.\d ms, through the endpoint \d+\.\d ms: overhead .*%")
    assert_lines(out, r"^programs +1: a call's latency less its own generate, same run: -?\d+\.\d+ ms",
                 r"^programs +1: of which the transport alone .*: -?\d+\.\d+ ms = .*; the endpoint's own: -?\d+\.\d+ ms")


def test_plugin_discovery_reports_cold_starts_against_python_and_pluggy() -> None:
    out = run_bench("plugin_discovery.py", "--plugins", "3", "--repeats", "1")
    assert_lines(out, rf"^agilerl --help .* {RATIO} +{RATIO}$", r"^plugins list with 3 plugins: \d+\.\d+ s")


def test_algorithm_loss_reports_every_algorithm_against_the_nll_step() -> None:
    out = run_bench("algorithm_loss.py", "--rounds", "1", "--batch", "2")
    for name in ("grpo", "cispo", "gspo", "llmppo", "llmreinforce"):
        assert_lines(out, rf"^\| {name}\b.* \| \d+\.\d \| {RATIO} \|$")


def test_train_step_reports_our_step_and_trl_when_installed() -> None:
    out = run_bench(
        "train_step.py", "--models", "tiny", "--steps", "1", "--batch", "1", "--group", "2", "--completion-tokens", "4"
    )
    assert_lines(out, r"^tiny +ours +\d+ +\d+ ")
    if importlib.util.find_spec("trl") is not None:
        assert_lines(out, r"^tiny +trl +\d+ +\d+ ", rf"^tiny: ours/trl generation {RATIO}")
    else:
        assert_lines(out, r"^TRL unavailable")


@pytest.mark.usefixtures("openenv_python")
def test_ws_server_compares_ours_with_openenv_core_and_bare_aiohttp() -> None:
    out = run_bench("ws_server.py", "--sessions", "2", "--seconds", "0.3", "--warmup", "0.1", "--rounds", "1")
    for server in ("openenv-core", "agilerl", "aiohttp-echo"):
        assert_lines(out, rf"^ +2 +{server} +\d+ ")


def test_judge_reports_the_capped_throughput_against_sequential_calls_and_the_rubric_overhead() -> None:
    out = run_bench("judge.py", "--samples", "4", "--cap", "2", "--latency-ms", "5", "--repeats", "200")
    assert_lines(
        out,
        r"^sequential calls: \d+\.\d+ s ",
        r"^at most 2 in flight: \d+\.\d+ s ",
        rf"^capped vs sequential: {RATIO} the throughput$",
        rf"^rule rubric: .* a sample \({RATIO}\)$",
        rf"^composite of 3 with a gate: .* a sample \({RATIO}\)$",
    )


@pytest.mark.slow  # builds a venv
def test_env_fleet_reports_isolated_starts_the_step_against_in_process_and_two_replicas_against_one() -> None:
    out = run_bench("env_fleet.py", "--steps", "1", "--batch-size", "2", "--group-size", "1", "--seconds", "0.5",
                    "--sessions", "2")
    assert_lines(
        out,
        rf"^start of an isolated env: cold \d+\.\d+ s, warm \d+\.\d+ s: warm is {RATIO} faster$",
        rf"^training step, guess env: in process \d+\.\d+ s, isolation venv \d+\.\d+ s: {RATIO} \(goal <= 1\.15x\)$",
        rf"^env steps/s, 5 ms of CPU a step, 2 sessions: 1 replica \d+, 2 replicas \d+: {RATIO}$",
    )


def test_viewer_reports_the_index_against_a_full_parse_and_the_page_size() -> None:
    out = run_bench("viewer.py", "--records", "400", "--per-step", "20")
    assert_lines(
        out,
        r"^baseline: json\.loads of every line \(400\) \d+\.\d+ s$",
        rf"^index \(open_source\): \d+\.\d+ s, {RATIO} the full parse$",
        r"^page: \d+\.\d MB, 400 of 400 records embedded, built in \d+\.\d+ s$",
        r"^browser: (the page rendered in .*: \d+\.\d+x|no Chromium on PATH, not measured)$",
    )


def test_ws_server_starts_a_server_again_on_another_port_when_its_own_was_taken_meanwhile(tmp_path) -> None:
    """The port a server is given is free when picked; another process may bind it while the
    server imports (it failed a suite run): that server starts again on a new port."""
    import socket

    spec = importlib.util.spec_from_file_location("ws_server_bench", ROOT / "bench" / "ws_server.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        free, ports = bench._free_port, iter([port])
        bench._free_port = lambda: next(ports, None) or free()  # the first server's port is already taken
        started = bench._start(("agilerl", "aiohttp-echo"), 4, tmp_path)
    try:
        urls = {name: url for name, (_, url) in started.items()}
        assert not urls["agilerl"].endswith(f":{port}")
        for url in urls.values():
            urllib.request.urlopen(url + "/health", timeout=10).close()
    finally:
        for proc, _ in started.values():
            proc.terminate()
            proc.wait(timeout=30)
