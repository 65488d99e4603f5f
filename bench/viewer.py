"""agilerl view on a long run: a synthetic run of N records (100k by default, shaped as the trainer
writes them), indexed, made into a page and opened in headless Chromium.

Baselines measured in the same run: parsing every line of rollouts.jsonl whole (what the index
avoids: it parses each record's head), and Chromium opening a page of one record (its start-up).

    python bench/viewer.py                      # 100k records, 1000 steps
    python bench/viewer.py --records 2000       # the smoke size tests/test_bench.py runs
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agilerl.view.page import write_page  # noqa: E402
from agilerl.view.sources import open_source  # noqa: E402


def write_run(folder: Path, steps: int, per_step: int) -> Path:
    """A run's files of ``steps x per_step`` records, each ~1 kB as the trainer writes them (a
    prompt and an answer, 100 token ids, a reward part; every 50th truncated)."""
    folder.mkdir(parents=True)
    with (folder / "metrics.jsonl").open("w") as metrics, (folder / "rollouts.jsonl").open("w") as records:
        for step in range(1, steps + 1):
            metrics.write(json.dumps({"step": step, "train/reward": step / steps, "reward/correct": 0.5}) + "\n")
            for i in range(per_step):
                records.write(json.dumps({
                    "step": step, "episode": f"{step}-{i}", "sample": 0, "samples": 1, "group": i // 8, "index": i,
                    "reward": (i * 7919 % 100) / 100, "rewards": [0.0, 1.0], "reward_components": {"correct": 1.0},
                    "truncated": i % 50 == 0, "error": None,
                    "turns": [{"role": "prompt", "turn": -1, "start": 0, "end": 60, "text": "a question " * 10},
                              {"role": "model", "turn": 0, "start": 60, "end": 100, "text": "an answer " * 6}],
                    "token_ids": list(range(i, 100 + i)), "mask": [0] * 60 + [1] * 40,
                }) + "\n")
    return folder


def _browse(chromium: str, page: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(
        [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=60000",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=600, check=True,
    )
    return time.perf_counter() - t0, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--per-step", type=int, default=100)
    parser.add_argument("--max-mb", type=int, default=24)
    args = parser.parse_args()
    steps = max(1, args.records // args.per_step)
    with tempfile.TemporaryDirectory() as tmp:
        run = write_run(Path(tmp) / "run", steps, args.per_step)
        size = (run / "rollouts.jsonl").stat().st_size
        print(f"records: {steps * args.per_step} in {steps} steps, rollouts.jsonl {size / 2**20:.1f} MB")

        t0 = time.perf_counter()
        with (run / "rollouts.jsonl").open("rb") as f:
            parsed = sum(1 for line in f if json.loads(line))
        full = time.perf_counter() - t0
        print(f"baseline: json.loads of every line ({parsed}) {full:.2f} s")

        t0 = time.perf_counter()
        source = open_source(run)
        index = time.perf_counter() - t0
        print(f"index (open_source): {index:.2f} s, {index / full:.2f}x the full parse")

        t0 = time.perf_counter()
        page = write_page([source], Path(tmp) / "page.html", budget=args.max_mb * 2**20)
        built = time.perf_counter() - t0
        embedded = page.read_text().count('"episode":')
        print(f"page: {page.stat().st_size / 2**20:.1f} MB, {embedded} of {len(source.entries)} records embedded, built in {built:.2f} s")
        print(f"index + page: {index + built:.2f} s")

        chromium = next((p for n in ("chromium", "chromium-browser", "google-chrome") if (p := shutil.which(n))), None)
        if chromium is None:
            print("browser: no Chromium on PATH, not measured")
            return
        tiny = write_page([open_source(write_run(Path(tmp) / "tiny", 1, 1))], Path(tmp) / "tiny.html")
        start, _ = _browse(chromium, tiny)
        opened, dom = _browse(chromium, page)
        assert 'class="chart"' in dom and 'class="turn model"' in dom, "the page did not render"
        print(f"browser: the page rendered in {opened:.2f} s, a one-record page in {start:.2f} s: {opened / start:.2f}x")


if __name__ == "__main__":
    main()
