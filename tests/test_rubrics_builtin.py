"""Built-in rubrics on real model-like strings, including adversarial ones."""

from __future__ import annotations

import pytest

from agilerl.builtins.rubrics import (
    boxed_match,
    countdown,
    evaluate_countdown,
    exact_match,
    extract_boxed,
    numeric_match,
    think_answer_format,
)
from agilerl.data.rubric import make_format_rubric
from agilerl.registry import resolve


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("Paris", "paris", 1.0),
        ("  The   Eiffel Tower. ", "the eiffel tower", 1.0),
        ("<think>maybe Lyon</think><answer> Paris </answer>", "Paris", 1.0),
        ("<answer>Lyon</answer> ... <answer>Paris</answer>", "Paris", 1.0),
        ("Paris, France", "Paris", 0.0),
        ("", "Paris", 0.0),
        ("42", 42, 1.0),
    ],
)
def test_exact_match(completion, answer, expected):
    assert exact_match(completion, answer) == expected


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("1,000", "1000", 1.0),
        ("1000.0", "1,000", 1.0),
        ("<answer>$1,000</answer>", 1000, 1.0),
        ("So the total is 1,234.5 apples.", "1234.5", 1.0),
        ("I think 12, no wait, 13", "13", 1.0),
        ("-7", "-7.00", 1.0),
        ("3/4", "0.75", 1.0),
        ("1e3", "1000", 1.0),
        ("1,2", "12", 0.0),
        ("no number here", "3", 0.0),
        ("1000.01", "1000", 0.0),
        ("<answer>7</answer> 8", "7", 1.0),
    ],
)
def test_numeric_match(completion, answer, expected):
    assert numeric_match(completion, answer) == expected


def test_numeric_match_refuses_a_non_numeric_answer():
    with pytest.raises(ValueError, match=r"the row's answer 'seven' is not a number"):
        numeric_match("7", "seven")


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        (r"so the result is \boxed{42}.", "42", 1.0),
        (r"\boxed{1,000}", "1000", 1.0),
        (r"first \boxed{1} then \boxed{2}", "2", 1.0),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}", 1.0),
        (r"\boxed{x^{2}+1}", "x^{2}+1", 1.0),
        ("42", "42", 0.0),
        (r"\boxed{42", "42", 0.0),
        (r"\boxed{41}", "42", 0.0),
    ],
)
def test_boxed_match(completion, answer, expected):
    assert boxed_match(completion, answer) == expected


def test_extract_boxed_skips_an_unclosed_last_box():
    assert extract_boxed(r"\boxed{7} and \boxed{8") == "7"
    assert extract_boxed("nothing") is None


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>add them</think>\n<answer>5</answer>", 1.0),
        ("<think>a\nb</think><answer>5</answer>\n", 1.0),
        ("Sure! <think>x</think><answer>5</answer>", 0.0),
        ("<think>x</think><answer>5</answer> trailing", 0.0),
        ("<answer>5</answer>", 0.0),
    ],
)
def test_think_answer_format(completion, expected):
    assert think_answer_format(completion) == expected


def test_custom_format_rubric():
    rubric = make_format_rubric(r"Answer: \d+", reward=0.5)
    assert rubric("Answer: 12") == 0.5
    assert rubric("Answer: 12 because") == 0.0


@pytest.mark.parametrize(
    ("completion", "nums", "target", "expected"),
    [
        ("<answer>(3 + 5) * 7</answer>", [3, 5, 7], 56, 1.0),
        ("<answer>7 * (5 + 3) = 56</answer>", [3, 5, 7], 56, 1.0),
        ("<answer>(8 - 2) / 3 * 9</answer>", "[2, 3, 8, 9]", 18, 1.0),
        ("<answer>3 * 3 * 5</answer>", [3, 5, 7], 45, 0.0),  # 3 used twice, 7 unused
        ("<answer>3 + 5</answer>", [3, 5, 7], 8, 0.0),  # 7 unused
        ("<answer>(3 + 5) * 7</answer>", [3, 5, 7], 57, 0.0),  # wrong value
        ("<answer>35 + 7</answer>", [3, 5, 7], 42, 0.0),  # digits glued together
        ("<answer>-3 + 5 + 7</answer>", [3, 5, 7], 9, 0.0),  # unary minus
        ("<answer>3 ** 5 - 7</answer>", [3, 5, 7], 236, 0.0),  # power
        ("<answer>3.0 + 5 + 7</answer>", [3, 5, 7], 15, 0.0),  # float literal
        ("<answer>7 / (5 - 5) + 3</answer>", [3, 5, 5, 7], 3, 0.0),  # division by zero
        ("<answer>__import__('os').system('echo hi')</answer>", [3], 3, 0.0),
        ("<answer>(lambda: 56)()</answer>", [56], 56, 0.0),
        ("<answer>[3][0] + 5 + 7</answer>", [3, 5, 7], 15, 0.0),
        ("<answer>" + "(" * 150 + "3" + ")" * 150 + "</answer>", [3], 3, 0.0),  # too long
        ("no answer tags, just 3 + 5 + 7", [3, 5, 7], 15, 0.0),
    ],
)
def test_countdown(completion, nums, target, expected):
    assert countdown(completion, nums, target) == expected


def test_countdown_division_is_exact():
    assert evaluate_countdown("(1 / 3) * 3 * 4", [1, 3, 3, 4]) == 4
    assert countdown("<answer>6 / 4 * 2</answer>", [6, 4, 2], 3) == 1.0


@pytest.mark.parametrize("name", ["exact_match", "numeric_match", "boxed_match", "think_answer_format", "countdown"])
def test_built_ins_resolve_by_registered_name(name):
    from agilerl.builtins import rubrics

    assert resolve("rubric", name) is getattr(rubrics, name)
