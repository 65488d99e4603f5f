"""JSON read from a model's text, with a bound on its nesting.

A model (or a client) can write arguments nested thousands deep: ``json.loads`` then raises
``RecursionError``, and a value that loads but nests hundreds deep breaks every recursive step
after it (the schema check, the transcript's ``json.dumps``). Every parser reads JSON here, and
``depth_problem`` bounds what any family (a plugin's too) hands back, so such a call is one with
status ``invalid_json`` and the episode goes on.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_DEPTH", "depth_problem", "loads", "first_value"]

MAX_DEPTH = 64
"""How deep a call's arguments may nest (objects and arrays); tool schemas need a handful."""

_DECODER = json.JSONDecoder()


def depth_problem(value: Any, limit: int = MAX_DEPTH) -> str | None:
    """What is wrong when ``value`` nests deeper than ``limit``; None when it does not. Iterative,
    so any depth is measured without recursion."""
    if type(value) is dict:  # the common case: flat arguments, one look at each value
        for item in value.values():
            if isinstance(item, (dict, list, tuple)):
                break
        else:
            return None
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > limit:
            return f"the arguments nest deeper than {limit} levels"
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, tuple)))
    return None


def loads(text: str) -> tuple[Any, str | None]:
    """``(value, None)``, or ``(None, what is wrong)``: invalid JSON, or nested too deep."""
    value, _, problem = first_value(text, whole=True)
    return value, problem


def first_value(text: str, *, whole: bool = False) -> tuple[Any, int, str | None]:
    """The first JSON value of ``text`` (leading whitespace skipped) and where it ends, as vLLM's
    parsers read a model's JSON (what follows is not theirs to refuse); ``whole``: nothing but
    whitespace may follow."""
    start = 0 if whole else len(text) - len(text.lstrip())
    try:
        if whole:
            value, end = json.loads(text), len(text)
        else:
            value, end = _DECODER.raw_decode(text, start)
    except RecursionError:
        return None, 0, f"invalid JSON: it nests deeper than {MAX_DEPTH} levels"
    except ValueError as exc:
        return None, 0, f"invalid JSON: {exc}"
    if text.count("[", start, end) + text.count("{", start, end) <= MAX_DEPTH:
        return value, end, None  # too few brackets to nest that deep
    problem = depth_problem(value)
    return (None, 0, f"invalid JSON: {problem}") if problem else (value, end, None)
