"""``agilerl env check``: see an env the way the model will, and what is wrong with it."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agilerl.chat import EpisodeChat
from agilerl.cli.args import add_adapter_flags, json_object
from agilerl.cli.json_output import print_json
from agilerl.errors import InvalidArgument, exception_text
from agilerl.images import observation_images

if TYPE_CHECKING:
    from agilerl.envs.client import EnvClient
    from agilerl.protocol import EnvInfo

__all__ = ["add_parser", "CHECK_TURNS"]

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
    check.add_argument("--episodes", type=int, default=1, help="Episodes to play (default: 1).")
    check.add_argument(
        "--actions",
        help='Comma-separated scripted actions, one per turn: "5,9,7" or JSON ones, "[0.5, -0.5],[1, 0]" '
        "(the last one repeats; the check's step plays the first; default: random numbers and words).",
    )
    check.add_argument(
        "--action", action="append", metavar="TEXT",
        help="One scripted completion for a turn, taken whole (commas and all); repeat it for "
        "each turn, in order (the last one repeats). Instead of --actions.",
    )
    check.add_argument("--max-turns", type=int, help="Turn budget (default: the env's max_turns).")
    check.add_argument("--seed", type=int, default=0, help="Seed of episode 0; episode i uses seed+i (default: 0).")
    check.add_argument(
        "--tokenizer",
        help="Show the transcript as the model sees it, chat template and all: a registered model "
        "('tiny') or a tokenizer folder / hub id (needs the [train] extra). Default: plain text.",
    )
    check.add_argument(
        "--strict", action="store_true",
        help="Warnings are problems too (an OpenEnv env whose reset ignores the seed fails).",
    )
    adapter = check.add_argument_group(
        "OpenEnv envs", "How the model's text reaches an OpenEnv env and its observation reads as "
        "text (the manifest's environment fields of the same names)."
    )
    add_adapter_flags(adapter)
    check.add_argument(
        "--tool-parser", metavar="NAME",
        help="Parse each completion's tool calls (hermes, ...; auto with --tokenizer) and run them as "
        "the env's call_tool; the transcript shows each call, its status and its result.",
    )
    check.add_argument(
        "--save-images", metavar="DIR", type=Path,
        help="Write every image the env shows to DIR (episode<E>_image<I>.png or .jpg); the plain "
        "transcript shows each as [image WxH].",
    )
    check.add_argument("--json", action="store_true", help="Print a JSON summary instead.")
    check.set_defaults(handler=_check)
    from agilerl.cli.env_prepare_cmd import add_parsers as add_prepare_parsers

    add_prepare_parsers(sub)  # env prepare, env prepared


_SPEC_FLAGS = (
    "max_turns", "action_field", "observation_field", "observation_processor", "image_field", "mcp_tool", "action_type",
    "tool_parser",
)
CHECK_TURNS = 5
"""Turns an episode plays when neither the env nor the flags give a budget."""


def _spec_for(args: argparse.Namespace) -> tuple[Any, Path | None]:
    from agilerl.manifest.spec import load_manifest, parse_env_spec

    flags = {name: getattr(args, name) for name in _SPEC_FLAGS if getattr(args, name) is not None}
    path = Path(args.source)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        manifest = load_manifest(path)
        fields = manifest.environment.model_dump(by_alias=True, exclude_unset=True)
        return parse_env_spec({**fields, **flags}), manifest.base_dir
    fields = {"env_type": "rollout", "entrypoint": args.source, "env_config": args.env_config}
    return parse_env_spec({**fields, **flags}), None


def _turn_budget(spec: Any, info: EnvInfo, summary: dict[str, Any]) -> int:
    """The spec's or the env's max_turns; else a short one for the check (a manifest must set it)."""
    try:
        return info.turn_budget(spec.max_turns)
    except InvalidArgument:  # no budget anywhere: play a short episode, and say so
        summary["notes"].append(f"played {CHECK_TURNS} turns an episode; --max-turns N to change")
        return CHECK_TURNS


def _check(args: argparse.Namespace) -> int:
    from agilerl.envs.checker import check_env
    from agilerl.assembly.env_factory import make_env_factory, placement
    from agilerl.envs.client import as_client

    if args.episodes < 0:
        raise InvalidArgument(f"--episodes must be >= 0, got {args.episodes}")
    spec, base_dir = _spec_for(args)
    factory = make_env_factory(spec, base_dir=base_dir)
    # the protocol's step plays the first scripted action: an env that takes no "1" (an Enum, a
    # list of floats) is checked with what it does take
    if args.actions and args.action:
        raise InvalidArgument("give --actions (comma-separated) or --action (repeated), not both")
    first = _policy(args)(0) if args.actions or args.action else "1"
    report = check_env(
        factory(), seed=args.seed, action=first, raise_on_error=False, strict=args.strict, max_turns=spec.max_turns,
        tool_parser=getattr(spec, "tool_parser", None),  # the step sends the action as a run does
    )
    if first == "1" and any(p.startswith("step('1') raised OpenEnvAdapterError") for p in report.problems):
        report.notes.append("the check steps with '1' unless --actions gives an action this env takes (its first)")
    summary: dict[str, Any] = {
        "env": report.env_name,
        "problems": report.problems,
        "warnings": report.warnings,
        "notes": report.notes,
        "episodes": 0,
        "turns": [],
        "rewards": [],
        "turn_rewards": [],
        "terminated": 0,
        "truncated": 0,
        "errors": [],
        "where": getattr(factory, "where", None) or placement(spec),
    }
    if report.ok and args.episodes:
        tokenizer = _load_tokenizer(args.tokenizer, base_dir) if args.tokenizer else None
        policy = _policy(args)
        max_turns: int | None = None
        for episode in range(args.episodes):
            client = as_client(factory())
            if max_turns is None:  # the first episode's env says, so no env is built just to ask
                max_turns = _turn_budget(spec, client.describe(), summary)
            player = (
                _TemplatedPlayer(client, tokenizer, max_turns, spec)
                if tokenizer
                else _TextPlayer(client, max_turns, getattr(spec, "tool_parser", None))
            )
            try:
                _play(player, episode, args, policy, summary)
            except Exception as exc:  # the env's bug: record it, keep playing
                summary["errors"].append(f"episode {episode}: {exception_text(exc)}")
            finally:
                player.close()
    if args.json:
        print_json(summary)
    else:
        _print_report(summary)
    if hasattr(factory, "close"):  # a fleet: its replicas stop now (and at exit, however it ends)
        factory.close()
    return 0 if report.ok and not summary["errors"] else 1


def _policy(args: argparse.Namespace) -> Any:
    scripted = list(args.action) if args.action else _split_actions(args.actions) if args.actions else None
    rng = random.Random(args.seed)

    def act(turn: int) -> str:
        if scripted:
            return scripted[min(turn, len(scripted) - 1)]
        return str(rng.randint(0, 100)) if rng.random() < 0.8 else rng.choice(_RANDOM_WORDS)

    return act


def _split_actions(text: str) -> list[str]:
    """``--actions``' actions: split at the commas outside brackets, braces and quotes, so JSON
    actions keep theirs ("[0.5, -0.5],[1, 0]" is two; "5,9,7" three)."""
    actions, depth, quote, start = [], 0, "", 0
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote and text[i - 1] != "\\" else quote
        elif char == '"':
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            actions.append(text[start:i].strip())
            start = i + 1
    return [*actions, text[start:].strip()]


def _load_tokenizer(name: str, base_dir: Path | None) -> Any:
    from agilerl.assembly.models import load_tokenizer

    return load_tokenizer(name, base_dir=base_dir)


class _TextPlayer:
    """Plays through the in-process client (the protocol's checks) and keeps a plain transcript."""

    def __init__(self, client: EnvClient, max_turns: int, tool_parser: str | None = None) -> None:
        self.routing = None
        if tool_parser is not None:  # calls parsed from the text, as an endpoint's would be
            from agilerl.rollout.tool_routing import ToolCallingClient, ToolRouting

            self.routing = ToolRouting.build(tool_parser, None)
            client = ToolCallingClient(client)
        self.client = client
        self.max_turns = max_turns
        info = client.describe()
        # the framing the harness gives an episode (EpisodeChat), so both transcripts agree
        self.defaults = EpisodeChat(system_prompt=info.system_prompt, tools=info.tools)
        self.chat = self.defaults
        self.name = info.name
        self.lines: list[str] = []
        self.turn = 0

    def reset(self, seed: int) -> None:
        prompt, info = self.client.reset(seed=seed)
        self.chat = self.defaults.for_episode(info, self.name)
        if self.chat.tools:
            self.lines.append(f"[tools] {', '.join(_tool_name(t) for t in self.chat.tools)}")
        self.images = list(observation_images(prompt))
        opening = self.chat.opening(_shown(prompt), info)
        self.lines += [f"[{m.get('role')}] {m.get('content')}" for m in opening]

    def step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        sent = action if self.routing is None else self.routing.action(action, self.chat.tools)
        observation, reward, terminated, truncated, info = self.client.step(sent)
        self.turn += 1
        truncated = truncated or (not terminated and self.turn >= self.max_turns)
        role = self.chat.role_for(info, self.name)
        self.lines.append(f"[assistant] {action}")
        if info.get("tool_calls"):
            self.lines += _tool_call_lines(info["tool_calls"])
            return reward, terminated, truncated, info
        self.images += observation_images(observation)
        if observation or not (terminated or truncated):  # the harness renders no empty last one
            self.lines.append(f"[{role}] {_shown(observation)}")
        return reward, terminated, truncated, info

    def transcript(self) -> str:
        return "\n".join(self.lines)

    def close(self) -> None:
        self.client.close()


def _shown(observation: Any) -> str:
    """An observation as the plain transcript shows it: ``[image WxH]`` per image, then its text."""
    return observation if isinstance(observation, str) else observation.transcript()


def _tool_call_lines(records: list[dict[str, Any]]) -> list[str]:
    """One turn's tool calls as transcript lines: each call, its status and its result."""
    lines = []
    for record in records:
        arguments = json.dumps(record.get("arguments"), ensure_ascii=False)
        lines.append(f"[call] {record.get('name')}({arguments}) {record.get('status')}")
        lines.append(f"[tool] {record.get('result')}")
    return lines


def _tool_name(tool: dict[str, Any]) -> str:
    return str(tool.get("name") or (tool.get("function") or {}).get("name") or "?")


class _TemplatedPlayer:
    """Plays through the RolloutHarness: the transcript is the tokens the model sees."""

    def __init__(self, client: EnvClient, tokenizer: Any, max_turns: int, spec: Any) -> None:
        from agilerl.rollout.harness import RolloutHarness

        self.harness = RolloutHarness(
            client, tokenizer, max_turns=max_turns, chat_template_kwargs=spec.chat_template_kwargs,
            tool_parser=getattr(spec, "tool_parser", None), send_reasoning=getattr(spec, "send_reasoning", False),
        )

    def reset(self, seed: int) -> None:
        self.harness.reset(seed=seed)

    def step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        _, reward, terminated, truncated, info = self.harness.step(action)
        return reward, terminated, truncated, info

    def transcript(self) -> str:
        return str(self.harness.tokenizer.decode(self.harness.trajectory.token_ids))

    @property
    def images(self) -> list[Any]:
        media = self.harness.trajectory.media
        return [] if media is None else list(media.images)

    def close(self) -> None:
        self.harness.close()


def _play(player: Any, episode: int, args: argparse.Namespace, act: Any, summary: dict[str, Any]) -> None:
    """One episode, scored and printed as a transcript."""
    seed = args.seed + episode
    player.reset(seed=seed)
    summary["episodes"] += 1
    total, turn, done = 0.0, 0, False
    lines = []
    scored: list[dict[str, Any]] = []  # each turn's reward and its components (--json)
    summary["turn_rewards"].append(scored)
    while not done:
        action = act(turn)
        reward, terminated, truncated, info = player.step(action)
        turn += 1
        total += reward
        done = terminated or truncated
        components = info.get("reward_components") if isinstance(info, dict) else None
        components = components if isinstance(components, dict) else {}
        scored.append({"reward": reward, "reward_components": components})
        parts = "  " + " ".join(f"{k}={v:g}" for k, v in components.items()) if components else ""
        lines.append(
            f"[turn {turn}] reward={reward:g} terminated={terminated} truncated={truncated}{parts}"
        )
        if isinstance(info, dict) and isinstance(info.get("tool_calls"), list):
            scored[-1]["tool_calls"] = info["tool_calls"]  # name, arguments, status, error, result
            if isinstance(player, _TemplatedPlayer):  # the plain transcript already shows them
                lines += ["  " + line for line in _tool_call_lines(info["tool_calls"])]
        summary["terminated"] += int(terminated)
        summary["truncated"] += int(truncated)
    summary["turns"].append(turn)
    summary["rewards"].append(total)
    if args.save_images is not None:
        args.save_images.mkdir(parents=True, exist_ok=True)
        for i, image in enumerate(player.images):
            image.save(args.save_images / f"episode{episode}_image{i}.{image.extension}")
    if not args.json:
        print(f"=== episode {episode} (seed {seed}): {turn} turns, reward {total:g}")
        print(player.transcript())
        print("\n".join(lines))


def _print_report(summary: dict[str, Any]) -> None:
    status = "ok" if not summary["problems"] else "PROBLEMS"
    print(f"env {summary['env']}: {status}")
    if summary.get("where"):
        print(f"  runs: {summary['where']}")
    for p in summary["problems"]:
        print(f"  problem: {p}")
    for w in summary["warnings"]:
        print(f"  warning: {w}")
    for n in summary["notes"]:
        print(f"  note: {n}")
    for e in summary["errors"]:
        print(f"  error: {e}")
    if summary["episodes"]:
        print(
            f"episodes={summary['episodes']} turns={summary['turns']} rewards={summary['rewards']} "
            f"terminated={summary['terminated']} truncated={summary['truncated']}"
        )
