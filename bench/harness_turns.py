"""Per-turn cost of RolloutHarness.step at the first and the last turn, against a raw baseline.

The raw baseline is what any harness must do at least: ``env.step`` plus ``tokenizer.encode`` of the
observation. Run: ``python bench/harness_turns.py``. Prints one line per episode length.

``--parsers`` (a comma list, or ``all``) adds the parser set: for each tool-call family, a harness
turn whose completion holds one call (parsed from the ids, checked, run as ``call_tool``, its
result rendered in the tool role) against the parse alone, measured in the same run: the share
of a turn that parsing costs.
"""

from __future__ import annotations

import argparse
import statistics
import time

from agilerl.train.tiny_model import build_tiny_tokenizer
from agilerl.rollout.harness import RolloutHarness

OBSERVATION = "Too high! Your guess was above the target, try a lower number."


class CountingEnv:
    """Never ends by itself: the harness's turn budget ends every episode.

    Every observation is new text (it carries a counter), so the harness's memo of repeated
    observations never hits: this measures the full per-turn work.
    """

    def __init__(self) -> None:
        self.count = 0

    def reset(self, seed=None):
        return "Guess a number between 1 and 100.", {}

    def step(self, action):
        self.count += 1
        return f"{OBSERVATION} ({self.count})", 0.0, False, False, {}


def raw_step_us(tokenizer, steps: int) -> float:
    env = CountingEnv()
    env.reset()
    start = time.perf_counter()
    for _ in range(steps):
        obs, *_ = env.step("42")
        tokenizer.encode(obs, add_special_tokens=False)
    return (time.perf_counter() - start) / steps * 1e6


def harness_turn_us(tokenizer, turns: int, episodes: int) -> tuple[float, float]:
    harness = RolloutHarness.local(CountingEnv(), tokenizer, max_turns=turns)
    completion = tokenizer.encode("42", add_special_tokens=False) + [harness.renderer.end_of_turn_id]
    first, last = [], []
    clock = time.perf_counter
    for _ in range(episodes):
        harness.reset(seed=0)
        for turn in range(turns):
            t0 = clock()
            harness.step(completion)
            dt = clock() - t0
            if turn == 0:
                first.append(dt)
            if turn == turns - 1:
                last.append(dt)
    return statistics.median(first) * 1e6, statistics.median(last) * 1e6


class ToolEnv:
    """One tool, ``add``; every result is new text, so no memo hits."""

    tools = [{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]

    def __init__(self) -> None:
        self.count = 0

    def reset(self, seed=None):
        return "What is 2 + 3?", {}

    def step(self, action):
        return "Call a tool.", 0.0, False, False, {}

    def call_tool(self, name, arguments):
        self.count += 1
        return f"{arguments['a'] + arguments['b']} ({self.count})", 0.0, False, False, {}


FAMILY_TOKENS = {
    "hermes": ("<tool_call>", "</tool_call>", "<think>", "</think>"),
    "qwen3_coder": ("<tool_call>", "</tool_call>"),
    "llama3_json": ("<|python_tag|>",),
    "mistral": ("[TOOL_CALLS]", "[ARGS]"),
    "granite": ("<|tool_call|>",),
    "gemma": ("<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>"),
    "harmony": ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|call|>", "<|return|>"),
    "deepseek": ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "<think>", "</think>"),
}


def generation_us(family: str, repeats: int = 5) -> float:
    """Median us the tiny model takes to generate one call's tokens (greedy, on CPU): the rest of
    a real turn, which the harness's bookkeeping sits beside."""
    import torch

    from agilerl.train.tiny_model import build_tiny_model

    tokenizer = build_tiny_tokenizer("chatml")
    tokenizer.add_special_tokens({"additional_special_tokens": list(FAMILY_TOKENS[family])})
    harness = RolloutHarness.local(ToolEnv(), tokenizer, max_turns=2, tool_parser=family)
    prompt, _ = harness.reset(seed=0)
    length = len(tokenizer.encode(harness.tool_routing.parser.format_call("add", {"a": 2, "b": 3}), add_special_tokens=False))
    model = build_tiny_model(tokenizer).eval()
    ids = torch.tensor([list(prompt)])
    times = []
    with torch.no_grad():
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=length, min_new_tokens=length,
                           do_sample=False, pad_token_id=tokenizer.pad_token_id)
            times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]) * 1e6


def parser_share(family: str, turns: int, episodes: int) -> tuple[float, float]:
    """Median us of a tool-calling harness turn and of its parse alone, for ``family``."""
    from agilerl.tools import ToolSet, resolve_tool_parser

    tokenizer = build_tiny_tokenizer("chatml")
    tokenizer.add_special_tokens({"additional_special_tokens": list(FAMILY_TOKENS[family])})
    harness = RolloutHarness.local(ToolEnv(), tokenizer, max_turns=turns, tool_parser=family)
    parser = harness.tool_routing.parser
    assert parser.on_ids, family
    completion = tokenizer.encode(parser.format_call("add", {"a": 2, "b": 3}), add_special_tokens=False)
    completion.append(harness.renderer.end_of_turn_id)
    tools = ToolSet(ToolEnv.tools)
    clock = time.perf_counter
    steps, parses = [], []
    for _ in range(episodes):
        harness.reset(seed=0)
        for _ in range(turns):
            t0 = clock()
            harness.step(completion)
            steps.append(clock() - t0)
            t0 = clock()
            parsed = parser.parse(completion, tools)
            parses.append(clock() - t0)
            assert parsed.calls[0].ok, parsed
    return statistics.median(steps) * 1e6, statistics.median(parses) * 1e6


def main(argv: list[str] | None = None) -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_argument("--parsers", default="", help="Comma list of tool-call families, or 'all' (default: none).")
    cli.add_argument("--parser-episodes", type=int, default=200)
    args = cli.parse_args(argv)
    tokenizer = build_tiny_tokenizer("chatml")
    harness_turn_us(tokenizer, 10, 20)  # warm-up
    raw = min(raw_step_us(tokenizer, 5000) for _ in range(3))
    print(f"raw baseline (env.step + tokenizer.encode): {raw:.1f} us/turn")
    for turns in (1, 10, 50, 200):
        episodes = max(20, 4000 // turns)
        first, last = harness_turn_us(tokenizer, turns, episodes)
        print(
            f"{turns:>3} turns: first {first:6.1f} us, last {last:6.1f} us, "
            f"last/first {last / first:4.2f}x, last/raw {last / raw:4.2f}x"
        )
    families = list(FAMILY_TOKENS) if args.parsers == "all" else [f for f in args.parsers.split(",") if f]
    shares, full_shares = [], []
    for family in families:
        parser_share(family, 5, 5)  # warm-up: the template's tool tail is learned once
        turn, parse = parser_share(family, 5, args.parser_episodes)
        generate = generation_us(family)
        shares.append(parse / turn)
        full_shares.append(parse / (turn + generate))
        print(
            f"parser {family:<11}: harness tool turn {turn:6.1f} us, parse {parse:5.1f} us = {parse / turn:5.1%}; "
            f"with the tiny model's generation ({generate / 1e3:.1f} ms) {parse / (turn + generate):.3%}"
        )
    if shares:
        print(
            f"parsing, largest share: {max(shares):.1%} of the harness's own tool turn, "
            f"{max(full_shares):.3%} of a turn with generation (goal < 5%)"
        )


if __name__ == "__main__":
    main()
