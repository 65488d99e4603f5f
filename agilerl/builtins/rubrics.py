"""Built-in rubrics: exact, numeric and ``\\boxed{}`` answer matching, a format check, a
Countdown equation checker, and LLM judges (``llm_judge``, ``llm_judge_group``: factories, built
from a manifest entry's ``config``). Model output is parsed, never evaluated.

Every matcher compares the completion's final answer: the last ``<answer>...</answer>`` when
there is one, else the whole completion.
"""

from __future__ import annotations

import ast
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

from agilerl.data.judges import GroupJudge, LLMJudge
from agilerl.data.rubric import make_format_rubric

__all__ = [
    "extract_answer",
    "extract_boxed",
    "normalize",
    "parse_number",
    "last_number",
    "exact_match",
    "numeric_match",
    "boxed_match",
    "think_answer_format",
    "countdown",
    "evaluate_countdown",
    "llm_judge",
    "llm_judge_group",
]

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")
_THINK_ANSWER = r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$"
_MAX_EQUATION_CHARS = 200


def extract_answer(completion: str) -> str:
    """The last ``<answer>`` block's content, or the whole completion when there is none."""
    tagged = _ANSWER_TAG.findall(completion)
    return (tagged[-1] if tagged else completion).strip()


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (nested braces balanced), or None."""
    start = text.rfind("\\boxed{")
    while start != -1:
        depth, i = 1, start + len("\\boxed{")
        begin = i
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[begin : i - 1].strip()
        start = text.rfind("\\boxed{", 0, start)
    return None


def normalize(text: Any) -> str:
    """Case-folded, whitespace collapsed, outer quotes/``$`` and a trailing period dropped."""
    text = " ".join(str(text).split()).casefold()
    text = text.strip().strip("\"'`").strip("$").strip()
    return text[:-1].rstrip() if text.endswith(".") else text


def parse_number(text: Any) -> float | None:
    """``1,000``, ``1000.0``, ``$1000``, ``-5``, ``3/4`` -> float; anything else -> None."""
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        return float(text)
    cleaned = normalize(text).replace("$", "").replace(" ", "")
    fraction = re.fullmatch(r"([-+]?\d+)/(\d+)", cleaned)
    if fraction:
        denominator = int(fraction.group(2))
        return int(fraction.group(1)) / denominator if denominator else None
    if not _NUMBER.fullmatch(cleaned):
        return None
    return float(cleaned.replace(",", ""))


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (thousands separators allowed)."""
    found = _NUMBER.findall(text)
    return parse_number(found[-1]) if found else None


def _same_number(got: float | None, expected: float) -> bool:
    return got is not None and math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9)


def _expected_number(answer: Any) -> float:
    expected = parse_number(answer)
    if expected is None:
        raise ValueError(f"the row's answer {answer!r} is not a number")
    return expected


def exact_match(completion: str, answer: Any) -> float:
    """1.0 when the final answer equals ``answer`` after normalising case and spacing."""
    return float(normalize(extract_answer(completion)) == normalize(answer))


def numeric_match(completion: str, answer: Any) -> float:
    """1.0 when the last number in the final answer equals ``answer`` (1,000 == 1000.0)."""
    final = extract_answer(completion)
    got = parse_number(final)
    if got is None:
        got = last_number(final)
    return float(_same_number(got, _expected_number(answer)))


def boxed_match(completion: str, answer: Any) -> float:
    """1.0 when the last ``\\boxed{}`` holds ``answer`` (numerically if both are numbers)."""
    boxed = extract_boxed(completion)
    if boxed is None:
        return 0.0
    expected = parse_number(answer)
    if expected is not None:
        return float(_same_number(parse_number(boxed), expected))
    return float(normalize(boxed) == normalize(answer))


think_answer_format = make_format_rubric(_THINK_ANSWER)
"""1.0 for ``<think>...</think>`` followed by ``<answer>...</answer>``, nothing else."""


def countdown(completion: str, question: Any, answer: Any) -> float:
    """1.0 when the final answer is an equation using each of ``question``'s numbers exactly once
    with ``+ - * /`` and parentheses, equal to ``answer`` (the target)."""
    numbers = _as_numbers(question)
    target = _expected_number(answer)
    value = evaluate_countdown(extract_answer(completion), numbers)
    return float(value is not None and value == Fraction(target).limit_denominator())


def evaluate_countdown(equation: str, numbers: Sequence[int]) -> Fraction | None:
    """The exact value of ``equation`` if it is legal for ``numbers``, else None.

    ``"expr = result"`` is read as ``expr``. Legal: integer literals, ``+ - * /``, parentheses,
    each of ``numbers`` used exactly once. Parsed with ``ast``; nothing is executed.
    """
    expression = equation.split("=", 1)[0].strip()
    if not expression or len(expression) > _MAX_EQUATION_CHARS:
        return None
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError):
        return None
    used: list[int] = []
    try:
        value = _evaluate(tree.body, used)
    except (ValueError, ZeroDivisionError):
        return None
    return value if Counter(used) == Counter(numbers) else None


_OPERATORS: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def _evaluate(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left = _evaluate(node.left, used)
        right = _evaluate(node.right, used)
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError(f"not allowed in a countdown equation: {ast.dump(node)[:60]}")


def _as_numbers(question: Any) -> list[int]:
    """The available numbers: a list of ints, or a string such as ``"[3, 5, 7]"`` or ``"3 5 7"``."""
    if isinstance(question, str):
        values = re.findall(r"-?\d+", question)
    else:
        values = list(question)
    numbers = [int(v) for v in values]
    if not numbers:
        raise ValueError(f"the row's numbers {question!r} hold no integers")
    return numbers


def llm_judge(*, base_url: str, model: str, **options: Any) -> LLMJudge:
    """A judge scoring each completion on an OpenAI-compatible endpoint (see docs/rubrics.md)."""
    return LLMJudge(base_url=base_url, model=model, **options)


def llm_judge_group(*, base_url: str, model: str, group_size: int, **options: Any) -> GroupJudge:
    """A judge ranking a whole GRPO group in one call, scores in [0, 1] (see docs/rubrics.md);
    ``group_size`` is the run's (training.group_size), so a group is judged the moment it is whole."""
    return GroupJudge(base_url=base_url, model=model, group_size=group_size, **options)


llm_judge.needs_config = "base_url, model"  # type: ignore[attr-defined]
llm_judge_group.needs_config = "base_url, model, group_size"  # type: ignore[attr-defined]
