"""bench/harness_turns.py's parser set runs (at its smallest size) and prints its ratio lines."""

from __future__ import annotations

import re

import pytest

from tests.test_bench import run_bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # builds the tiny model to time its generation


def test_the_parser_set_reports_parsing_against_a_tool_turn() -> None:
    out = run_bench("harness_turns.py", "--parsers", "hermes,harmony", "--parser-episodes", "5")
    for family in ("hermes", "harmony"):
        assert re.search(rf"^parser {family} +: harness tool turn +\d+\.\d us, parse +\d+\.\d us = +\d+\.\d%; ", out, re.M), out
    assert re.search(r"^parsing, largest share: \d+\.\d% of the harness's own tool turn, \d+\.\d+% of a turn with generation", out, re.M), out
