"""The parsers where vLLM's own parser tests found them stricter (issue 41): each case as text
and as token ids. Accepted: mistral's text after (and junk before) the list, qwen3_coder's
``float``/``num*`` types and values holding its own tags, a hermes call the output ends inside
with a whole body, granite's plain ``<tool_call>``, gemma's ``108.``, deepseek's text after the
arguments. Refused, as docs/tools.md says why: non-object arguments, llama3_json in prose,
qwen3_coder without its ``<tool_call>`` wrapper."""

from __future__ import annotations

import pytest

from agilerl.tools import ToolSet, resolve_tool_parser
from tests.test_tools_harness import TOOLS
from tests.tool_families import family_tokenizer

_DS = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
_TYPED = [{"name": "measure", "parameters": {"type": "object", "properties": {
    "x": {"type": "float"}, "y": {"type": "number"}, "z": {"type": "double"}, "n": {"type": "int64"},
    "flag": {"type": "bool"}}}}]
_WRITE = [{"name": "write", "parameters": {"type": "object", "properties": {"code": {"type": "string"}, "path": {"type": "string"}}}}]

ACCEPTED = [
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}] Done.', TOOLS, [("add", {"a": 1, "b": 2})]),
    ("mistral", '[TOOL_CALLS] sure: [{"name": "add", "arguments": {"a": 1, "b": 2}}]', TOOLS, [("add", {"a": 1, "b": 2})]),
    ("qwen3_coder", "<tool_call>\n<function=measure>\n<parameter=x>\n1.5\n</parameter>\n<parameter=y>\n2\n</parameter>\n"
     "<parameter=z>\n-0.25\n</parameter>\n<parameter=n>\n7\n</parameter>\n<parameter=flag>\ntrue\n</parameter>\n"
     "</function>\n</tool_call>", _TYPED, [("measure", {"x": 1.5, "y": 2.0, "z": -0.25, "n": 7, "flag": True})]),
    ("qwen3_coder", '<tool_call>\n<function=write>\n<parameter=code>\nprint("</parameter>")\n</parameter>\n'
     "<parameter=path>\na.py\n</parameter>\n</function>\n</tool_call>", _WRITE,
     [("write", {"code": 'print("</parameter>")', "path": "a.py"})]),
    ("qwen3_coder", "<tool_call>\n<function=write>\n<parameter=code>\ns = '''\n<parameter=x>1</parameter>\n</function>'''\n"
     "</parameter>\n<parameter=path>\nb.py\n</parameter>\n</function>\n</tool_call>", _WRITE,
     [("write", {"code": "s = '''\n<parameter=x>1</parameter>\n</function>'''", "path": "b.py"})]),
    ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n', TOOLS, [("add", {"a": 1, "b": 2})]),
    ("granite", '<tool_call>[{"name": "add", "arguments": {"a": 1, "b": 2}}]', TOOLS, [("add", {"a": 1, "b": 2})]),
    ("gemma", "<|tool_call>call:add{a:108.,b:2}<tool_call|>", [{"name": "add", "parameters": {"type": "object"}}],
     [("add", {"a": 108.0, "b": 2})]),
    ("deepseek", f'{_DS[0]}function{_DS[1]}add\n```json\n{{"a": 1, "b": 2}}\n```\nthat is all{_DS[2]}', TOOLS,
     [("add", {"a": 1, "b": 2})]),
    ("deepseek", f'{_DS[0]}add{_DS[1]}{{"a": 1, "b": 2}} then done{_DS[2]}', TOOLS, [("add", {"a": 1, "b": 2})]),
    ("deepseek", f'Adding.{_DS[0]}add{_DS[1]}{{"a": 1, "b": 2}}{_DS[2]} Then I submit.', TOOLS, [("add", {"a": 1, "b": 2})]),
]

REFUSED = [
    ("hermes", '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', "invalid_json"),
    ("hermes", '<tool_call>{"name": "add", "arguments": {"a": 1, "b": ', "unclosed"),
    ("llama3_json", 'Here it is: {"name": "add", "parameters": {"a": 1, "b": 2}}', None),
    ("qwen3_coder", "<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n</parameter>\n</function>", None),
    ("granite", "<tool_call> is how some models open a call.", None),
]


def _both(family: str, text: str, tools: list) -> list:
    """The text parsed as text, and as the family tokenizer's ids (markers as their tokens)."""
    tokenizer = family_tokenizer(family)
    on_text = resolve_tool_parser(family, None).parse_text(text, ToolSet(tools))
    on_ids = resolve_tool_parser(family, tokenizer).parse(tokenizer.encode(text, add_special_tokens=False), ToolSet(tools))
    return [on_text, on_ids]


@pytest.mark.parametrize(("family", "text", "tools", "calls"), ACCEPTED, ids=lambda v: v if isinstance(v, str) and len(v) < 12 else "")
def test_what_vllm_accepts_and_we_chose_to_runs(family, text, tools, calls):
    for parsed in _both(family, text, tools):
        assert [(c.name, c.arguments, c.status) for c in parsed.calls] == [(n, a, "ok") for n, a in calls]
        assert parsed.calls[0].arguments == calls[0][1] and all(type(v) is type(calls[0][1][k]) for k, v in parsed.calls[0].arguments.items())


@pytest.mark.parametrize(("family", "text", "status"), REFUSED, ids=lambda v: v if isinstance(v, str) and len(v) < 14 else "")
def test_what_we_chose_to_refuse_stays_refused(family, text, status):
    for parsed in _both(family, text, TOOLS):
        if status is None:
            assert parsed.calls == () and parsed.content.strip() == text.strip()
        else:
            assert [c.status for c in parsed.calls] == [status]
