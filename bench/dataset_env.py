"""QADatasetEnv over a 100k-row Parquet: resets per second, and the memory of 64 envs vs one.

Baselines measured in the same run: raw Arrow row access (``table[i]``) for speed, and the load
plus a single env for memory. Target: 64 envs sharing one table cost < 1.2x the memory of one.
Memory is measured in fresh child processes (RSS, Python heap via tracemalloc, Arrow heap).

    python bench/dataset_env.py [--rows 100000] [--envs 64] [--resets 20000]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path


def rss_bytes() -> int:
    """Resident set size of this process, from /proc (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmRSS not found in /proc/self/status")


def write_parquet(path: Path, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    questions = [f"What is {i} plus {i * 7 % 1000}? Answer with a number." for i in range(rows)]
    answers = [str(i + i * 7 % 1000) for i in range(rows)]
    pq.write_table(pa.table({"question": questions, "answer": answers}), path)


def make_spec():
    from agilerl.manifest.spec import parse_env_spec

    return parse_env_spec(
        {
            "env_type": "rollout",
            "dataset": "rows.parquet",
            "rubric_name": "agilerl.builtins.rubrics:numeric_match",
            "prompt_template": {"system_0": "Be exact.", "user_1": "{question}"},
        }
    )


def measure_memory(folder: str, n_envs: int) -> dict[str, int]:
    """In this (fresh) process: memory added by loading the table and building ``n_envs`` envs."""
    import datasets  # noqa: F401 - imports are not the table's cost: load them first
    import pyarrow as pa

    from agilerl.assembly.datasets import qa_env_factory
    from agilerl.data.rubric import load_rubric

    spec = make_spec()
    load_rubric(spec.rubric_name or "")
    gc.collect()
    tracemalloc.start()
    rss0, arrow0 = rss_bytes(), pa.total_allocated_bytes()
    factory = qa_env_factory(spec, base_dir=folder)
    envs = [factory() for _ in range(n_envs)]
    for seed, env in enumerate(envs):
        env.reset(seed=seed)
    gc.collect()
    heap = tracemalloc.get_traced_memory()[0]
    return {
        "rss": rss_bytes() - rss0,
        "heap": heap,
        "arrow": pa.total_allocated_bytes() - arrow0,
    }


def child_memory(folder: str, n_envs: int) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", folder, str(n_envs)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def rate(fn, count: int) -> float:
    """Calls per second of ``fn(i)`` for i in range(count)."""
    start = time.perf_counter()
    for i in range(count):
        fn(i)
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--resets", type=int, default=20_000)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure_memory(args.child[0], int(args.child[1]))))
        return

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HF_DATASETS_CACHE"] = str(Path(tmp) / "hf-cache")  # nothing left behind
        from agilerl.assembly.datasets import qa_env_factory

        write_parquet(Path(tmp) / "rows.parquet", args.rows)
        factory = qa_env_factory(make_spec(), base_dir=tmp)  # also fills the datasets cache
        envs = [factory() for _ in range(args.envs)]
        print(f"rows: {args.rows}, envs: {args.envs} (train split {envs[0].dataset_size} rows)")

        one, many = child_memory(tmp, 1), child_memory(tmp, args.envs)
        for key, label in (("rss", "RSS"), ("heap", "Python heap"), ("arrow", "Arrow heap")):
            print(
                f"memory, {label}: load + 1 env {one[key] / 2**20:.2f} MiB, load + {args.envs} "
                f"envs {many[key] / 2**20:.2f} MiB -> {many[key] / max(one[key], 1):.3f}x"
            )
        total_one = one["rss"]
        extra = (many["heap"] - one["heap"]) / (args.envs - 1)
        print(
            f"each extra env: {extra / 1024:.2f} KiB of Python heap "
            f"({extra / max(total_one, 1) * 100:.3f}% of the load + 1 env RSS)"
        )

        train = envs[0].data.splits.train
        size, count = len(train), args.resets
        baseline = rate(lambda i: train[(i * 7919) % size], count)
        single = rate(lambda i: envs[0].reset(seed=i), count)
        shared = rate(lambda i: envs[i % len(envs)].reset(seed=i), count)

        def episode(i: int) -> None:
            env = envs[i % len(envs)]
            env.reset(seed=i)
            env.step("<answer>7</answer>")

        episodes = rate(episode, count)
        print(f"raw Arrow row access (baseline): {baseline:,.0f} rows/s")
        print(f"reset, 1 env: {single:,.0f}/s ({single / baseline:.2f}x baseline)")
        print(
            f"reset, {args.envs} envs round-robin: {shared:,.0f}/s ({shared / baseline:.2f}x baseline)"
        )
        print(
            f"reset + step (numeric_match), {args.envs} envs: {episodes:,.0f}/s "
            f"({episodes / baseline:.2f}x baseline)"
        )


if __name__ == "__main__":
    main()
