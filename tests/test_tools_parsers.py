"""Each family's parser against its real chat template (tests/data/chat_templates): the call the
template renders parses back, literal tag text does not, drafts in reasoning are skipped, and
every malformed call gets its status."""

from __future__ import annotations

import pytest

from agilerl.llm_envs import RolloutHarness
from agilerl.tools import ToolSet, check_arguments, detect_family, resolve_tool_parser
from tests.test_tools_harness import TOOLS, CalcEnv
from tests.tool_families import FAMILIES, family_tokenizer

PARSER_OF = {"hermes-qwen3": "hermes"}


def _call(name="add", arguments=None, family=""):
    arguments = {"a": 1, "b": 2} if arguments is None else arguments
    if family == "deepseek":  # its template concatenates the arguments as text
        import json

        arguments = json.dumps(arguments)
    return {"id": "call00000", "type": "function", "function": {"name": name, "arguments": arguments}}


def _spelled(tokenizer, text):
    """``text`` with every special token spelled out of ordinary ones, as an env's text that
    quotes a tag reaches a model (one character at a time)."""
    import re

    specials = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
    ids = []
    for piece in re.split("(" + "|".join(map(re.escape, specials)) + ")", text):
        if piece in specials:
            ids += [t for ch in piece for t in tokenizer.encode(ch, add_special_tokens=False)]
        elif piece:
            ids += tokenizer.encode(piece, add_special_tokens=False)
    return ids


def _token_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _generated(family, tokenizer, messages, tool_calls):
    """The ids a model writes for ``tool_calls`` after ``messages``: the template's own render of
    them, up to and including the model's stop token."""
    prompt = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    answer = {"role": "assistant", "content": "", "tool_calls": tool_calls}
    full = tokenizer.apply_chat_template([*messages, answer], tools=TOOLS, tokenize=False)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    full_ids = tokenizer.encode(full, add_special_tokens=False)
    generated = full_ids[_token_prefix(prompt_ids, full_ids):]
    stop = {"harmony": "<|call|>", "gemma": "<|tool_response>"}.get(family, tokenizer.eos_token)
    stop_id = tokenizer.convert_tokens_to_ids(stop)
    return generated[: generated.index(stop_id) + 1]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_auto_picks_the_family_and_its_templates_call_parses_back(family):
    tokenizer = family_tokenizer(family)
    assert detect_family(tokenizer) == PARSER_OF.get(family, family)
    parser = resolve_tool_parser("auto", tokenizer)
    assert parser.on_ids  # the family's markers are tokens: parsed on ids
    ids = _generated(family, tokenizer, [{"role": "user", "content": "What is 1+2?"}], [_call(family=family)])
    parsed = parser.parse(ids, ToolSet(TOOLS))
    assert [(c.name, c.arguments, c.status) for c in parsed.calls] == [("add", {"a": 1, "b": 2}, "ok")]
    assert parsed.content == "" and parsed.unit == "token"
    start, end = parsed.calls[0].span
    assert 0 <= start < end <= len(ids)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "hermes-qwen3"])
def test_format_call_round_trips_and_literal_tags_do_not_parse(family):
    tokenizer = family_tokenizer(family)
    parser = resolve_tool_parser(PARSER_OF.get(family, family), tokenizer)
    text = parser.format_call("add", {"a": 3, "b": 4})
    parsed = parser.parse(tokenizer.encode(text, add_special_tokens=False), ToolSet(TOOLS))
    assert [(c.name, c.arguments, c.status) for c in parsed.calls] == [("add", {"a": 3, "b": 4}, "ok")]
    spelled = _spelled(tokenizer, text)
    if family != "llama3_json":  # its calls are bare JSON: there is no tag to spell out
        assert parser.parse(spelled).calls == ()


@pytest.mark.parametrize(
    ("family", "draft"),
    [
        ("hermes-qwen3", "<think>I could {call}</think>\n\nNo tool needed: 7."),
        ("deepseek", "<think>I could {call}</think>No tool needed: 7."),
        ("gemma", "<|channel>thought\nI could {call}<channel|>No tool needed: 7."),
        ("harmony", "<|channel|>analysis<|message|>I could call add<|end|><|start|>assistant<|channel|>final<|message|>No tool needed: 7.<|return|>"),
    ],
)
def test_calls_drafted_in_reasoning_are_not_run(family, draft):
    tokenizer = family_tokenizer(family)
    parser = resolve_tool_parser(PARSER_OF.get(family, family), tokenizer)
    text = draft.format(call=parser.format_call("add", {"a": 1, "b": 2}))
    parsed = parser.parse(tokenizer.encode(text, add_special_tokens=False), ToolSet(TOOLS))
    assert parsed.calls == () and parsed.content == "No tool needed: 7." and "could" in parsed.reasoning


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ('<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>', "invalid_json"),
        ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2', "unclosed"),  # a whole body runs (docs/tools.md)
        ('<tool_call>{"arguments": {"a": 1}}</tool_call>', "missing_name"),
        ('<tool_call>{"name": "divide", "arguments": {}}</tool_call>', "unknown_tool"),
        ('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', "schema_violation"),
        ('<tool_call>{"name": "add", "arguments": {"a": "x", "b": 2}}</tool_call>', "schema_violation"),
        ('<tool_call>{"name": "add", "arguments": "{\\"a\\": \\"1\\", \\"b\\": 2.0}"}</tool_call>', "ok"),
    ],
)
def test_every_malformed_call_gets_its_status(text, status):
    tokenizer = family_tokenizer("hermes")
    parser = resolve_tool_parser("hermes", tokenizer)
    (call,) = parser.parse(tokenizer.encode(text, add_special_tokens=False), ToolSet(TOOLS)).calls
    assert call.status == status
    assert (call.error is None) == (status == "ok")
    if status == "ok":
        assert call.arguments == {"a": 1, "b": 2}  # coerced: the schema says integer


def test_text_is_parsed_at_marker_strings_when_the_tokenizer_lacks_them():
    parser = resolve_tool_parser("qwen3_coder", None)
    text = "Let me add.\n<tool_call>\n<function=add>\n<parameter=a>\n12\n</parameter>\n<parameter=b>\n30\n</parameter>\n</function>\n</tool_call>"
    parsed = parser.parse_text(text, ToolSet(TOOLS))
    assert parsed.unit == "char" and parsed.content == "Let me add."
    (call,) = parsed.calls
    assert (call.name, call.arguments, call.status) == ("add", {"a": 12, "b": 30}, "ok")
    assert text[call.span[0] : call.span[1]].startswith("<tool_call>") and text[call.span[0] : call.span[1]].endswith("</tool_call>")


def test_schema_check_names_the_field_and_coerces_only_what_the_schema_says():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
              "required": ["n"], "additionalProperties": False}
    assert check_arguments(schema, {"n": "4", "tags": '["x"]'}) == ({"n": 4, "tags": ["x"]}, None)
    assert check_arguments(schema, {"n": 4.5})[1] == "arguments.n must be integer, got 4.5"
    assert "unexpected 'm'" in check_arguments(schema, {"n": 1, "m": 2})[1]
    assert "lacks required 'n'" in check_arguments(schema, {})[1]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_tool_turn_renders_token_for_token_as_the_family_template_renders_it(family):
    """Incremental: prompt + generated call + tool result + next prompt; the part after the call
    is the family template's own render of the result, and for templates that do not rewrite
    history (Qwen3 and Gemma 4 drop an empty thinking block) the whole is one full render."""
    tokenizer = family_tokenizer(family)
    env = CalcEnv()
    harness = RolloutHarness.local(env, tokenizer, tool_parser="auto")
    user = [{"role": "user", "content": "What is 2+3?"}]
    prompt, _ = harness.reset(seed=0)
    prompt = list(prompt)
    call = _call(arguments={"a": 2, "b": 3}, family=family)
    generated = _generated(family, tokenizer, user, [call])
    view, reward, done, _, info = harness.step(generated)
    assert not done and env.calls == [("add", {"a": 2, "b": 3})]
    assert info["tool_calls"][0]["result"] == "5"
    conversation = [*user, {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call00000", "name": "add", "content": "5"}]
    full = tokenizer.apply_chat_template(conversation, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    view = list(view)
    assert view[: len(prompt) + len(generated)] == prompt + generated
    tail = tokenizer.decode(view[len(prompt) + len(generated) :])
    assert tail and full.endswith(tail) and "5" in tail
    if harness.renderer.full_render_identical:
        assert view == tokenizer.encode(full, add_special_tokens=False)
    traj = harness.trajectory
    assert [t for t, m in zip(traj.token_ids, traj.action_mask) if m] == generated


def test_a_template_that_moves_its_tool_list_keeps_it_where_the_model_first_saw_it():
    """Mistral v0.3 renders the tool list before the newest user message, so a full render moves
    it every turn: the conversation is appended instead (what the model saw), the list stays in
    front of the first question, and a later user turn is the template's own [INST] turn."""
    tokenizer = family_tokenizer("mistral")
    harness = RolloutHarness.local(CalcEnv(), tokenizer, tool_parser="mistral")
    prompt, _ = harness.reset(seed=0)
    user = [{"role": "user", "content": "What is 2+3?"}]
    call = _generated("mistral", tokenizer, user, [_call(arguments={"a": 2, "b": 3}, family="mistral")])
    after_call, *_ = harness.step(call)
    answer = tokenizer.encode("It is 5.", add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("</s>")]
    view, _, done, _, _ = harness.step(answer)
    assert not done and list(view[: len(after_call) + len(answer)]) == list(after_call) + answer
    text = tokenizer.decode(list(view))
    assert text.count("[AVAILABLE_TOOLS]") == 1 and text.index("[AVAILABLE_TOOLS]") < text.index("What is 2+3?")
    plain = [*user, {"role": "assistant", "content": "a"}]  # the template's turn, rendered without tools
    before, after = (tokenizer.apply_chat_template(m, tokenize=False) for m in (plain, [*plain, {"role": "user", "content": "Use the tools."}]))
    assert list(view[len(after_call) + len(answer) :]) == tokenizer.encode(after.removeprefix(before), add_special_tokens=False)
