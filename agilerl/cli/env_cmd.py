"""``agilerl env check``: see an env the way the model will, and what is wrong with it."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from agilerl.cli.args import json_object
from agilerl.errors import AgileRLError

_RANDOM_WORDS = ("yes", "no", "hello", "higher", "lower", "done", "?")


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("env", help="Check an env against the text-env protocol.")
    sub = parser.add_subparsers(dest="env_command", metavar="ACTION", required=True)
    check = sub.add_parser(
        "check",
        help="Check an env and play episodes with a scripted or random policy.",
        description="SOURCE is an entrypoint (registered name, module:attr, file.py:attr) or a "
        "manifest file (whatever source its environment section names).",
    )
    check.add_argument("source")
    check.add_argument("--env-config", type=json_object, default={}, help="JSON keyword arguments.")
    check.add_argument("--episodes", type=int, default=1)
    check.add_argument("--actions", help='Comma-separated scripted actions, one per turn: "5,9,7".')
    check.add_argument("--max-turns", type=int, help="Turn budget (default: the env's max_turns).")
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--json", action="store_true", help="Print a JSON summary instead.")
    check.set_defaults(handler=_check)


def _spec_for(args: argparse.Namespace) -> tuple[Any, Path | None]:
    from agilerl.manifest.spec import load_manifest, parse_env_spec

    path = Path(args.source)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        manifest = load_manifest(path)
        spec = manifest.environment
        if args.max_turns is not None:
            spec = spec.model_copy(update={"max_turns": args.max_turns})
        return spec, manifest.base_dir
    fields = {"env_type": "rollout", "entrypoint": args.source, "env_config": args.env_config}
    if args.max_turns is not None:
        fields["max_turns"] = args.max_turns
    return parse_env_spec(fields), None


def _check(args: argparse.Namespace) -> int:
    from agilerl.builtins.tiny_model import build_tiny_tokenizer
    from agilerl.envs.checker import check_env
    from agilerl.factory import make_env_factory, resolve_max_turns
    from agilerl.rollout.harness import RolloutHarness

    if args.episodes < 0:
        raise AgileRLError(f"--episodes must be >= 0, got {args.episodes}")
    spec, base_dir = _spec_for(args)
    factory = make_env_factory(spec, base_dir=base_dir)
    report = check_env(factory(), seed=args.seed, raise_on_error=False)
    summary: dict[str, Any] = {
        "env": report.env_name,
        "problems": report.problems,
        "notes": report.notes,
        "episodes": 0,
        "turns": [],
        "rewards": [],
        "terminated": 0,
        "truncated": 0,
        "errors": [],
    }
    if report.ok and args.episodes:
        max_turns = resolve_max_turns(spec, factory)
        tokenizer = build_tiny_tokenizer()
        policy = _policy(args)
        for episode in range(args.episodes):
            harness = RolloutHarness(
                factory(), tokenizer, max_turns=max_turns, chat_template_kwargs=spec.chat_template_kwargs
            )
            try:
                _play(harness, episode, args, policy, summary)
            except Exception as exc:  # the env's bug: record it, keep playing
                summary["errors"].append(f"episode {episode}: {type(exc).__name__}: {exc}")
            finally:
                harness.close()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_report(summary)
    return 0 if report.ok and not summary["errors"] else 1


def _policy(args: argparse.Namespace) -> Any:
    scripted = [a.strip() for a in args.actions.split(",")] if args.actions else None
    rng = random.Random(args.seed)

    def act(turn: int) -> str:
        if scripted:
            return scripted[min(turn, len(scripted) - 1)]
        return str(rng.randint(0, 100)) if rng.random() < 0.8 else rng.choice(_RANDOM_WORDS)

    return act


def _play(harness: Any, episode: int, args: argparse.Namespace, act: Any, summary: dict[str, Any]) -> None:
    """One episode; the transcript is what the model sees, chat template and all."""
    seed = args.seed + episode
    harness.reset(seed=seed)
    summary["episodes"] += 1
    total, turn, done = 0.0, 0, False
    lines = []
    while not done:
        action = act(turn)
        _, reward, terminated, truncated, _ = harness.step(action)
        turn += 1
        total += reward
        done = terminated or truncated
        lines.append(
            f"[turn {turn}] reward={reward:g} terminated={terminated} truncated={truncated}"
        )
        summary["terminated"] += int(terminated)
        summary["truncated"] += int(truncated)
    summary["turns"].append(turn)
    summary["rewards"].append(total)
    if not args.json:
        print(f"=== episode {episode} (seed {seed}): {turn} turns, reward {total:g}")
        print(harness.tokenizer.decode(harness.trajectory.token_ids))
        print("\n".join(lines))


def _print_report(summary: dict[str, Any]) -> None:
    status = "ok" if not summary["problems"] else "PROBLEMS"
    print(f"env {summary['env']}: {status}")
    for p in summary["problems"]:
        print(f"  problem: {p}")
    for n in summary["notes"]:
        print(f"  note: {n}")
    for e in summary["errors"]:
        print(f"  error: {e}")
    if summary["episodes"]:
        print(
            f"episodes={summary['episodes']} turns={summary['turns']} rewards={summary['rewards']} "
            f"terminated={summary['terminated']} truncated={summary['truncated']}"
        )
