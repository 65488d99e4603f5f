"""Tool calls between the harness and the env: a completion parsed into calls, each call run as
the env's ``call_tool(name, arguments)``, the results rendered in the ``tool`` role.

The harness owns one ``ToolRouting`` when ``tool_parser`` is set, and its client is wrapped in a
``ToolCallingClient``, so every caller that steps the client (the harness, the collector's async
slots) routes calls the same way without knowing about them. A completion without a call is a
text ``step`` as before; a bad call (``unknown_tool``, ``invalid_json``, ...) is answered by an
error in the ``tool`` role and the episode goes on. The step's info keeps one record per call
(``info["tool_calls"]``: name, arguments, status, span, error, result): the transcript, the
metrics and ``agilerl env check`` read it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from agilerl.chat import ChatRenderer
from agilerl.chat.renderer import split_at_sentinels
from agilerl.envs.client import EnvClient, WrappingClient
from agilerl.envs.tool_check import takes_only_calls
from agilerl.errors import AgileRLWarning, ChatTemplateError, EnvTimeoutError
from agilerl.protocol import StepResult
from agilerl.tools import REFUSED_INFO, ParsedCompletion, ToolParser, ToolSet, function_tool, resolve_tool_parser

__all__ = ["TOOL_CALLS_INFO", "TURN_TOOL_CALLS", "ToolAction", "ToolRouting", "ToolCallingClient", "late_call", "tool_tail_text"]

TOOL_CALLS_INFO = "tool_calls"
"""The step info key holding the records of the turn's calls."""
TURN_TOOL_CALLS = "turn_tool_calls"
"""The trajectory info key holding each model turn's call records, in turn order (the records of
``rollouts.jsonl`` show them with their status)."""

_SENTINEL = "@@AGILERL_TOOL_RESULT_{}@@"
_PROBE = " probe {}\n  text "
_BASES = ([{"role": "user", "content": "u"}], [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
_KEPT = 256


class ToolAction(str):
    """What the env receives for one completion: as text, its content (reasoning removed unless
    opted in); ``parsed`` holds the calls a ``ToolCallingClient`` runs instead."""

    parsed: ParsedCompletion

    def __new__(cls, text: str, parsed: ParsedCompletion) -> ToolAction:
        action = super().__new__(cls, text)
        action.parsed = parsed
        return action


class ToolRouting:
    """One harness's parser and the memo of how its chat template renders tool results."""

    def __init__(self, parser: ToolParser, *, send_reasoning: bool = False) -> None:
        self.parser = parser
        self.send_reasoning = send_reasoning
        self._toolsets: dict[int, tuple[Any, ToolSet]] = {}
        self._tails: dict[tuple[int, tuple[str, ...], bool], list[str] | None] = {}
        self._specials: frozenset[int] | None = None
        self._warned = False
        self._warned_role = False

    @classmethod
    def build(cls, setting: Any, tokenizer: Any, *, send_reasoning: bool = False) -> ToolRouting:
        """From a ``tool_parser`` setting: a registered name, ``auto``, a class or a parser."""
        return cls(resolve_tool_parser(setting, tokenizer), send_reasoning=send_reasoning)

    def action(self, completion: Sequence[int] | str, tools: list[dict[str, Any]] | None) -> ToolAction:
        """Parse one completion (ids, or text) and check its calls against the episode's tools."""
        toolset = self._toolset(tools)
        if isinstance(completion, str):
            parsed = self.parser.parse_text(completion, toolset)
        else:
            parsed = self.parser.parse(completion, toolset)
        text = parsed.text if self.send_reasoning else parsed.content
        return ToolAction(text, parsed)

    def tail_ids(
        self, renderer: ChatRenderer, info: dict[str, Any], *, final: bool, action_ids: Sequence[int] = ()
    ) -> list[int] | None:
        """The ids after a tool-calling completion: its close, one ``tool`` message per call (in
        order) and, unless final, the next generation prompt; None when the step ran no call.
        Special tokens the model already wrote as its stop (Gemma's ``<|tool_response>``) are not
        repeated."""
        records = info.get(TOOL_CALLS_INFO)
        if not records or not isinstance(records, list):
            return None
        names = tuple(str(r.get("name") or "") for r in records)
        results = [str(r.get("result", "")) for r in records]
        ids = tuple(str(r.get("id") or f"call{i:05d}") for i, r in enumerate(records))
        key = (id(renderer), names, final, ids)
        if key not in self._tails:
            if len(self._tails) >= _KEPT:
                self._tails.clear()
            try:
                self._tails[key] = _learn_tail(renderer, names, final, self.parser.calls_end, ids)
            except ChatTemplateError:
                self._tails[key] = None  # rendered each time, with the fallback below
        pieces = self._tails[key]
        if pieces is None:
            try:
                text = self._tail_text(renderer, names, results, final, ids)
            except ChatTemplateError as exc:  # no tool role at all: the results as one observation
                return self._as_observation(renderer, results, final, exc)
        else:
            text = pieces[0] + "".join(result + piece for result, piece in zip(results, pieces[1:]))
        tail = renderer.encode(text)
        return tail[_overlap(action_ids, tail, self._special_ids(renderer)) :]

    def _tail_text(
        self, renderer: ChatRenderer, names: tuple[str, ...], results: list[str], final: bool, ids: tuple[str, ...]
    ) -> str:
        try:
            return tool_tail_text(renderer, names, results, final=final, calls_end=self.parser.calls_end, ids=ids)
        except ChatTemplateError:
            if len(names) < 2:
                raise
        # Llama 3.1's and GPT-OSS's templates refuse several calls in one answer: the results go
        # in one tool message, in order, so the episode goes on
        if not self._warned:
            self._warned = True
            warnings.warn(
                "the chat template refuses several tool calls in one answer: their results are "
                "rendered together in one tool message",
                AgileRLWarning,
                stacklevel=3,
            )
        joined = ["\n".join(results)]
        return tool_tail_text(renderer, names[:1], joined, final=final, calls_end=self.parser.calls_end, ids=ids[:1])

    def _as_observation(
        self, renderer: ChatRenderer, results: list[str], final: bool, exc: ChatTemplateError
    ) -> list[int]:
        """A template that cannot render a tool result after a call (no ``tool`` role, no
        ``tool_calls``) gets the results as one observation, in the ``tool`` role when it renders
        one after an answer, else the user's; warned once. The episode goes on."""
        role = "tool" if renderer.renders_role("tool") else "user"
        if not self._warned_role:
            self._warned_role = True
            warnings.warn(
                f"the chat template cannot render tool results after a call ({exc}); they are "
                f"rendered as one {role} message",
                AgileRLWarning,
                stacklevel=4,
            )
        return renderer.turn_tail_ids(role, "\n".join(results), final=final)

    def _special_ids(self, renderer: ChatRenderer) -> frozenset[int]:
        if self._specials is None:
            try:
                self._specials = frozenset(renderer.tokenizer.get_added_vocab().values())
            except Exception:  # noqa: BLE001 - a tokenizer without added tokens
                self._specials = frozenset()
        return self._specials

    def _toolset(self, tools: list[dict[str, Any]] | None) -> ToolSet | None:
        if tools is None:
            return ToolSet(())  # no tools offered: every call is to an unknown tool
        held = self._toolsets.get(id(tools))
        if held is None or held[0] is not tools:
            if len(self._toolsets) >= _KEPT:
                self._toolsets.clear()
            held = (tools, ToolSet(tools))
            self._toolsets[id(tools)] = held
        return held[1]


def tool_tail_text(
    renderer: ChatRenderer,
    names: Sequence[str],
    results: Sequence[str],
    *,
    final: bool,
    calls_end: str | None = None,
    ids: Sequence[str] | None = None,
) -> str:
    """What the chat template puts after an assistant turn that called ``names``, their
    ``results`` in the ``tool`` role, and (unless ``final``) the generation prompt: the render of
    the conversation from where the calls end, so the model's own call tokens stay as generated."""
    refusals: list[Exception] = []
    # arguments as a mapping (Qwen3-Coder's template iterates them), else as JSON text
    # (DeepSeek's concatenates them); the tail after the calls does not depend on them
    for base, arguments in ((b, a) for b in _BASES for a in ({}, "{}")):
        calls = [
            {"id": ids[i] if ids else f"call{i:05d}", "type": "function", "function": {"name": name, "arguments": arguments}}
            for i, name in enumerate(names)
        ]
        answer = {"role": "assistant", "content": "", "tool_calls": calls}
        messages = [
            {"role": "tool", "tool_call_id": call["id"], "name": name, "content": result}
            for call, name, result in zip(calls, names, results)
        ]
        try:
            prompt = renderer.render_text(base, add_generation_prompt=True)
            after = renderer.render_text([*base, answer, *messages], add_generation_prompt=not final)
        except (ChatTemplateError, TypeError) as exc:
            refusals.append(exc)
            continue
        start = _common_prefix(prompt, after)  # where the answer's rendering starts
        end = after.rfind(calls_end, start) if calls_end else -1
        if end >= 0:  # the model writes it (Harmony's <|call|>): the tail starts after it
            end += len(calls_end or "")
        elif renderer.assistant_close:  # the template's close of the answer begins the tail
            end = after.find(renderer.assistant_close, start)
        if end < 0:
            raise ChatTemplateError(
                "the chat template's render of a tool-calling answer holds no "
                f"{calls_end or renderer.assistant_close!r}: where the calls end cannot be found"
            )
        return after[end:]
    raise ChatTemplateError(f"the chat template cannot render a tool result after a call: {refusals[0]}")


def _learn_tail(
    renderer: ChatRenderer, names: tuple[str, ...], final: bool, calls_end: str | None, ids: tuple[str, ...]
) -> list[str] | None:
    """The tail's text around each result, or None when the template alters results (then each
    tail is rendered)."""
    sentinels = [_SENTINEL.format(i) for i in range(len(names))]
    text = tool_tail_text(renderer, names, sentinels, final=final, calls_end=calls_end, ids=ids)
    pieces = split_at_sentinels(text, sentinels)
    if pieces is None:
        return None
    probes = [_PROBE.format(i) for i in range(len(names))]
    expected = pieces[0] + "".join(p + piece for p, piece in zip(probes, pieces[1:]))
    probe = tool_tail_text(renderer, names, probes, final=final, calls_end=calls_end, ids=ids)
    return pieces if probe == expected else None


def _overlap(action_ids: Sequence[int], tail: list[int], specials: frozenset[int]) -> int:
    """How many special tokens that open ``tail`` already end the completion (at most 2)."""
    for k in (2, 1):
        if len(action_ids) >= k and len(tail) >= k and list(action_ids[-k:]) == tail[:k]:
            if all(t in specials for t in tail[:k]):
                return k
    return 0


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


class ToolCallingClient(WrappingClient):
    """An env client whose steps run parsed calls through the env's ``call_tool``; everything
    else is the wrapped client's. ``reset`` adds the env's tools (MCP ``tools/list``) to the
    episode's info when the env does not set its own, so the chat template shows them."""

    def __init__(self, client: EnvClient) -> None:
        super().__init__(client)
        self._tools: list[dict[str, Any]] | None = None
        self._listed = False
        self.calling: str | None = None
        """The ``call_tool`` in flight (left set when it raised or was given up on): what a step's
        timeout names (``late_call``)."""
        self.tools_only = False
        """(Known after the first reset.) An MCP env with no ``mcp_tool`` takes only tool calls: a completion without one is
        answered with the list of its tools, and the episode goes on."""

    def reset(
        self, seed: int | None = None, *, row_index: int | None = None, evaluation: bool | None = None
    ) -> tuple[str, dict[str, Any]]:
        prompt, info = self.inner.reset(seed, row_index=row_index, evaluation=evaluation)
        if not self._listed:
            self._tools, self._listed = self._specs(self.inner.list_tools()), True
            self.tools_only = takes_only_calls(self.inner)
        return prompt, self._with_tools(info)

    async def areset(
        self, seed: int | None = None, *, row_index: int | None = None, evaluation: bool | None = None
    ) -> tuple[str, dict[str, Any]]:
        prompt, info = await self.inner.areset(seed, row_index=row_index, evaluation=evaluation)
        if not self._listed:
            self._tools, self._listed = self._specs(await self.inner.alist_tools()), True
            self.tools_only = takes_only_calls(self.inner)
        return prompt, self._with_tools(info)

    def step(self, action: str) -> StepResult:
        calls = action.parsed.calls if isinstance(action, ToolAction) else ()
        self.calling = None
        if not calls:
            return self._no_call() if self.tools_only else self.inner.step(str(action))
        results = []
        for call in calls:
            self.calling = self._naming(call)
            results.append((call, self.inner.call_tool(call.name, call.arguments) if call.ok else None))
            self.calling = None
            if _ended(results[-1][1]):
                break
        return _combined(results)

    async def astep(self, action: str) -> StepResult:
        calls = action.parsed.calls if isinstance(action, ToolAction) else ()
        self.calling = None
        if not calls:
            return self._no_call() if self.tools_only else await self.inner.astep(str(action))
        results = []
        for call in calls:
            self.calling = self._naming(call)
            results.append((call, await self.inner.acall_tool(call.name, call.arguments) if call.ok else None))
            self.calling = None
            if _ended(results[-1][1]):
                break
        return _combined(results)

    def _naming(self, call: Any) -> str:
        return f"{getattr(self.inner, 'name', type(self.inner).__name__)}.call_tool({call.name!r})"

    def _no_call(self) -> StepResult:
        names = ", ".join(t["function"]["name"] for t in self._tools or ()) or "none"
        return f"No tool call found. Call one of the tools: {names}.", 0.0, False, False, {TOOL_CALLS_INFO: []}

    def _with_tools(self, info: dict[str, Any]) -> dict[str, Any]:
        if self._tools and "tools" not in info and not self.inner.describe().tools:
            info = {**info, "tools": self._tools}
        return info

    @staticmethod
    def _specs(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        return [function_tool(t) for t in tools] if tools else None


def late_call(client: Any, exc: BaseException) -> BaseException:
    """A step's timeout, named by the env's ``call_tool`` that was running when it came (not
    ``step``); any other failure as it is."""
    calling = getattr(client, "calling", None)
    if isinstance(exc, EnvTimeoutError) and isinstance(calling, str):
        return EnvTimeoutError(f"{calling} did not finish: {exc}")
    return exc


def _ended(result: StepResult | None) -> bool:
    return result is not None and (result[2] or result[3])


def _combined(results: list[tuple[Any, StepResult | None]]) -> StepResult:
    """One step's result for the calls of one completion: rewards summed, the episode over when
    a call ended it, each call's record (and result text) in ``info["tool_calls"]``."""
    records = []
    reward, terminated, truncated = 0.0, False, False
    info: dict[str, Any] = {}
    for call, result in results:
        record = call.as_record()
        observation, r, terminated, truncated, step_info = call.refusal() if result is None else result
        refused = step_info.pop(REFUSED_INFO, None)
        if isinstance(refused, dict):  # the env's server refused what we sent (its tools differ)
            record.update(status=refused.get("status"), error=refused.get("error"))
        record["result"] = observation
        reward += r
        info.update(step_info)
        records.append(record)
    info[TOOL_CALLS_INFO] = records
    return "", reward, terminated, truncated, info
