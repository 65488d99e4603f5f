"""Cold start with 100 installed plugins: ``agilerl plugins list`` and ``agilerl --help``.

A temp venv (seeing this interpreter's site-packages through a ``.pth`` file, so agilerl and its
dependencies come from this environment, a venv or not) gets 100 generated plugin distributions,
each registering three envs with lazy ``module:attr`` targets. Every command runs in a fresh
interpreter; baselines in the same run: ``python -c pass`` and ``python -c "import pluggy"``.
Targets: ``agilerl --help`` under 2x ``import pluggy``; ``plugins list`` under 1.5 s.
``--names`` adds one plugin registering that many names, then twice as many: ``envs list``
(registration and listing) must stay well under a second and grow linearly (ratio near 2).
``--slow N`` adds N plugins whose import sleeps 1 s: loaded at once, ``plugins list --json`` costs
about one second more than without them, not N (loaded one after another).

    python bench/plugin_discovery.py [--plugins 100] [--repeats 7] [--names 10000] [--slow 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agilerl.registry.testing import overlay_venv, write_distribution

PLUGIN_SOURCE = '''
from agilerl import hookimpl

@hookimpl
def register_envs(register):
    for level in ("easy", "medium", "hard"):
        register(f"bench{index}/{{level}}", "bench_plugin_{index}.env:Env", description=level)
'''


def make_venv(root: Path, plugins: int) -> Path:
    """A venv over this environment's packages (``overlay_venv``), with ``plugins`` generated plugin dists."""
    python, purelib = overlay_venv(root)
    for index in range(plugins):
        module = f"bench_plugin_{index}"
        write_distribution(
            purelib,
            f"agilerl-env-bench{index}",
            "1.0",
            {
                f"{module}/__init__.py": PLUGIN_SOURCE.format(index=index),
                f"{module}/env.py": "import heavy_dependency_never_imported_by_listing\n",
            },
            plugins={f"bench{index}": module},
        )
    return python


MANY_SOURCE = """
from agilerl import hookimpl

@hookimpl
def register_envs(register):
    for i in range({names}):
        register(f"many/{{i}}", "bench_many.env:Env")
"""


def names_seconds(root: Path, names: int, repeats: int, env: dict[str, str]) -> float:
    """Cold ``agilerl envs list --json`` with one plugin registering ``names`` names."""
    site = root / f"many-{names}"
    write_distribution(site, "agilerl-env-many", "1.0", {"bench_many/__init__.py": MANY_SOURCE.format(names=names)},
                       plugins={"many": "bench_many"})
    many_env = {**env, "PYTHONPATH": str(site), "AGILERL_PLUGINS": "many"}
    listed = subprocess.run([sys.executable, "-m", "agilerl", "envs", "list", "--json"], capture_output=True,
                            text=True, env=many_env, check=True)
    assert sum(row["plugin"] == "many" for row in json.loads(listed.stdout)) == names
    return cold_seconds([sys.executable, "-m", "agilerl", "envs", "list", "--json"], repeats, many_env)


def slow_seconds(root: Path, slow: int, repeats: int, env: dict[str, str]) -> float:
    """Cold ``agilerl plugins list --json`` with ``slow`` more plugins, each sleeping 1 s at import."""
    site = root / f"slow-{slow}"
    for index in range(slow):
        write_distribution(site, f"agilerl-env-slow{index}", "1.0", {f"bench_slow_{index}/__init__.py": "import time\ntime.sleep(1)\n"},
                           plugins={f"slow{index}": f"bench_slow_{index}"})
    slow_env = {**env, "PYTHONPATH": str(site)}
    return cold_seconds([sys.executable, "-m", "agilerl", "plugins", "list", "--json"], repeats, slow_env)


def cold_seconds(command: list[str], repeats: int, env: dict[str, str]) -> float:
    """Median wall time of ``command`` in a fresh process (one warm-up run first)."""
    times = []
    for attempt in range(repeats + 1):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, env=env)
        if attempt:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plugins", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--names", type=int, default=10_000, help="names one plugin registers (0: skip)")
    parser.add_argument("--slow", type=int, default=0, help="plugins whose import sleeps 1 s (0: skip)")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGILERL_")}
    with tempfile.TemporaryDirectory(prefix="agilerl-bench-") as tmp:
        python = str(make_venv(Path(tmp) / "venv", args.plugins))
        listing = subprocess.run(
            [python, "-m", "agilerl", "plugins", "list", "--json"], capture_output=True, text=True, env=env, check=True
        )
        rows = json.loads(listing.stdout)
        bench_rows = [r for r in rows if r["name"].startswith("bench")]
        assert len(bench_rows) == args.plugins and all(r["status"] == "ok" for r in bench_rows)
        runs = {
            "python -c pass": [python, "-c", "pass"],
            "python -c 'import pluggy'": [python, "-c", "import pluggy"],
            "agilerl --help": [python, "-m", "agilerl", "--help"],
            f"agilerl plugins list ({args.plugins} plugins)": [python, "-m", "agilerl", "plugins", "list"],
            "agilerl plugins list --json": [python, "-m", "agilerl", "plugins", "list", "--json"],
        }
        seconds = {name: cold_seconds(cmd, args.repeats, env) for name, cmd in runs.items()}
        if args.names:
            for count in (args.names, 2 * args.names):
                seconds[f"agilerl envs list --json ({count:,} names)"] = names_seconds(
                    Path(tmp), count, args.repeats, env
                )
        if args.slow:
            seconds["agilerl plugins list --json (the plugins here)"] = cold_seconds(
                [sys.executable, "-m", "agilerl", "plugins", "list", "--json"], args.repeats, env
            )
            seconds[f"  ... and {args.slow} plugins of 1 s"] = slow_seconds(Path(tmp), args.slow, args.repeats, env)
    base, pluggy_s = seconds["python -c pass"], seconds["python -c 'import pluggy'"]
    print(f"{len(rows)} plugins listed ({args.plugins} generated), median of {args.repeats} cold runs")
    print(f"{'command':<44} {'seconds':>8} {'x pass':>7} {'x pluggy':>9}")
    for name, value in seconds.items():
        print(f"{name:<44} {value:8.3f} {value / base:6.2f}x {value / pluggy_s:8.2f}x")
    help_ratio = seconds["agilerl --help"] / pluggy_s
    list_s = seconds[f"agilerl plugins list ({args.plugins} plugins)"]
    print(f"agilerl --help / import pluggy: {help_ratio:.2f}x (target < 2x)")
    print(f"plugins list with {args.plugins} plugins: {list_s:.3f} s (target < 1.5 s)")
    if args.names:
        one, two = (seconds[f"agilerl envs list --json ({n:,} names)"] for n in (args.names, 2 * args.names))
        print(f"{args.names:,} names listed in {one:.3f} s (target well under 1 s); twice as many: "
              f"{two / one:.2f}x the time (linear: about 2x, less with the fixed start-up cost)")


    if args.slow:
        extra = seconds[f"  ... and {args.slow} plugins of 1 s"] - seconds["agilerl plugins list --json (the plugins here)"]
        print(f"{args.slow} plugins of 1 s add {extra:.2f} s (loaded at once: about 1 s; one after another: {args.slow} s)")


if __name__ == "__main__":
    main()
