"""Write countdown.parquet: Countdown tasks (reach ``target`` from ``nums``), each solvable.

Run ``python make_data.py [--rows N] [--seed S] [--out PATH]``; the same seed writes the same file.
Each task is built backwards from a random equation, so ``solution`` always reaches ``target``.
"""

from __future__ import annotations

import argparse
import random
from fractions import Fraction
from pathlib import Path

OPERATORS = "+-*/"


def make_task(rng: random.Random) -> dict[str, object]:
    """Numbers, a positive whole target and one equation that reaches it."""
    while True:
        nums = [rng.randint(1, 20) for _ in range(rng.choice((3, 4)))]
        terms = [(str(n), Fraction(n)) for n in nums]
        rng.shuffle(terms)
        while len(terms) > 1:
            (left, a), (right, b) = terms.pop(), terms.pop()
            op = rng.choice(OPERATORS)
            if op == "/" and b == 0:
                break
            value = a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b
            terms.append((f"({left} {op} {right})", value))
        if len(terms) == 1:
            text, value = terms[0]
            if value.denominator == 1 and 0 < value <= 1000:
                return {"nums": nums, "target": int(value), "solution": text[1:-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("countdown.parquet"))
    args = parser.parse_args()

    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(args.seed)
    tasks = [make_task(rng) for _ in range(args.rows)]
    table = pa.table({key: [task[key] for task in tasks] for key in ("nums", "target", "solution")})
    pq.write_table(table, args.out)
    print(f"wrote {len(tasks)} tasks to {args.out}")


if __name__ == "__main__":
    main()
