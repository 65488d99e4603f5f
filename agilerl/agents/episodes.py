"""An agent program's episode as training samples: the exact tokens of every call it made.

An episode is the sequence of its calls. A call whose messages extend an earlier call's messages
plus the reply it was given continues that call's sample: its prompt is that sample's tokens (the
earlier prompts and completions, exactly as generated) followed by the tokens of the new messages
only. A call that extends no sample (the program compacted its history, dropped thinking, started
a sub-agent, changed its system prompt or tools) starts a new sample from a fresh render. History
is never re-tokenized from text, so the model trains on exactly what it saw and generated.

The new messages are rendered the way the harness renders tool results: the chat template renders
a short conversation (an opening, the reply as given, the new messages), and the text after the
reply's close is what they add; constant work per call, whatever the history's length.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agilerl.chat import ChatRenderer
from agilerl.errors import ChatTemplateError, InvalidArgument
from agilerl.images import EnvImage
from agilerl.generation.media import VisionMedia
from agilerl.generation.policy import Generation
from agilerl.rollout.harness import TokenView
from agilerl.rollout.trajectory import Trajectory
from agilerl.rollout.vision import VisionTurns

__all__ = ["CallPlan", "Episode", "continuation_ids", "continuation_text", "normalize_messages"]

_BASES = (
    [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
    [{"role": "user", "content": "u"}],
)
"""Openings a reply can follow when its continuation is rendered (as ``agilerl.chat`` learns
templates: some refuse a system message)."""


def _content(content: Any) -> str | list[dict[str, Any]]:
    """A message's content as text, or (when it shows images) its parts in order: text parts and
    ``{"type": "image_url", "url": ...}``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidArgument(f"a message's content must be a string or a list of parts, got {type(content).__name__}")
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "image_url":
            url = part.get("image_url")
            parts.append({"type": "image_url", "url": str(url.get("url", "") if isinstance(url, dict) else url)})
        else:
            raise InvalidArgument(f"a message content part of type {kind!r}: this endpoint takes text and image_url parts")
    if any(p["type"] == "image_url" for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def _arguments(value: Any) -> Any:
    """Tool-call arguments as a mapping when they are JSON (clients send them as text)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def normalize_messages(messages: Sequence[Any], start: int = 0) -> list[dict[str, Any]]:
    """Messages as the chat template takes them and as calls are compared: role, text content,
    tool calls (arguments as mappings) and the tool call a result answers; the rest a client adds
    (``refusal: null``, ``annotations``) is dropped. ``start``: the first one's index in the
    request (for errors)."""
    out = []
    for i, message in enumerate(messages, start):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidArgument(f"messages[{i}] must be an object with a string 'role'")
        item: dict[str, Any] = {"role": message["role"], "content": _content(message.get("content"))}
        calls = message.get("tool_calls")
        if calls:
            item["tool_calls"] = [
                {
                    "id": str(call.get("id", "")),
                    "type": "function",
                    "function": {
                        "name": str((call.get("function") or {}).get("name", "")),
                        "arguments": _arguments((call.get("function") or {}).get("arguments")),
                    },
                }
                for call in calls
            ]
        if message.get("tool_call_id") is not None:
            item["tool_call_id"] = str(message["tool_call_id"])
        if message["role"] == "tool" and message.get("name") is not None:
            item["name"] = str(message["name"])
        out.append(item)
    return out


History = list[Any] | str | tuple[int, ...]
"""What a sample's next call must begin with: chat messages, text, or token ids."""


@dataclass
class _Sample:
    """One training sample being built: its token stream and the conversation it holds."""

    trajectory: Trajectory
    history: History
    """The messages (chat) of its last call plus the reply, its text so far (completions), or its
    token ids so far (completions sent as token ids)."""
    tools: str = ""
    ended: bool = False
    """The model sampled an image placeholder: the sample takes no further call."""
    last_turn: int = -1
    """The episode turn (call index) of its last completion: its next prompt tokens belong to it."""


@dataclass
class CallPlan:
    """What a call will generate from: its prompt ids, and where its completion goes."""

    prompt_ids: list[int]
    sample: _Sample | None
    """The sample it extends (None: it starts one)."""
    base_len: int = 0
    """The extended sample's length when the call was planned."""
    history: History = field(default_factory=list)
    tools: str = ""
    media: VisionMedia | None = None
    """The sample's images with this call's (a vision policy), handed to the policy with the prompt."""

    @property
    def prompt(self) -> Sequence[int]:
        """The prompt as the policy takes it: the ids, with the images they show."""
        return self.prompt_ids if self.media is None else TokenView(self.prompt_ids, len(self.prompt_ids), self.media)


class Episode:
    """The calls of one program's episode, kept as samples (see the module doc).

    Calls come from the endpoint's connection threads; the lock keeps them and a concurrent reader
    (the episode's end) consistent.
    """

    def __init__(
        self, episode_id: str, key: str, renderer: ChatRenderer, *, max_calls: int | None = None,
        vision: VisionTurns | None = None,
    ) -> None:
        self.id = episode_id
        self.key = key
        self.renderer = renderer
        self.vision = vision
        """A vision policy's image turns (its processor); None: image parts are refused."""
        self.max_calls = max_calls
        self.calls = 0
        self.call_s = 0.0
        self.generated_tokens = 0
        self.in_flight = 0
        self.last_chat: list[dict[str, Any]] | None = None
        """The latest chat call's messages plus its reply: the final conversation, for rubrics."""
        self._samples: list[_Sample] = []
        self._sent: tuple[list[Any], list[dict[str, Any]]] = ([], [])
        """The last chat call's messages as sent, and normalized: a program resends its history."""
        self._turn = 0
        self._closed = False
        self._lock = threading.Lock()

    # -- planning a call ----------------------------------------------------------------------

    def plan_chat(self, sent: list[Any], tools: list[dict[str, Any]] | None, calls_end: str | None) -> CallPlan:
        """The prompt of a chat call (its messages as the program ``sent`` them): the sample it
        extends plus its new messages, or a fresh render."""
        key = json.dumps(tools, sort_keys=True) if tools else ""
        renderer = self.renderer.with_tools(tools or None)
        with self._lock:
            messages = self._normalized(sent)
            best = None
            for sample in self._samples:
                history = sample.history
                if (
                    isinstance(history, list) and sample.tools == key and len(history) < len(messages)
                    and not sample.ended and messages[: len(history)] == history
                    and (best is None or len(history) > len(best.history))
                ):
                    best = sample
            if self.vision is None and any(isinstance(m["content"], list) for m in messages):  # parts: an image
                raise InvalidArgument("image_url parts need a vision policy (a model with a processor)")
            if best is None:
                if self.vision is None:
                    return CallPlan(renderer.prompt_ids(messages), None, history=messages, tools=key)
                media = VisionMedia()
                text = renderer.render_text(self._shown(messages), add_generation_prompt=True)
                ids = self.vision.tokens(text, _images(messages), media, f"episode {self.id}")
                return CallPlan(ids, None, history=messages, tools=key, media=media)
            traj = best.trajectory
            new = messages[len(best.history) :]
            if self.vision is None:
                tail = continuation_ids(renderer, best.history[-1], new, traj.token_ids, calls_end)
                return CallPlan(traj.token_ids + tail, best, len(traj.token_ids), messages, key)
            media = _extended(traj.media)
            text = continuation_text(renderer, best.history[-1], self._shown(new), calls_end)
            tail = _without_overlap(
                renderer, traj.token_ids, self.vision.tokens(text, _images(new), media, f"episode {self.id}")
            )
            return CallPlan(traj.token_ids + tail, best, len(traj.token_ids), messages, key, media)

    def _normalized(self, sent: list[Any]) -> list[dict[str, Any]]:
        """``normalize_messages(sent)``, reusing the last call's work for the messages it resent
        unchanged (a program resends its whole history each call: only the new ones are read)."""
        last, done = self._sent
        same = 0
        for old, new in zip(last, sent):
            if old != new:
                break
            same += 1
        messages = done[:same] + normalize_messages(sent[same:], same)
        self._sent = (sent, messages)
        return messages

    def _shown(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Messages as the template shows them to a vision policy: each image a template image
        part, placeholders written in text escaped."""
        assert self.vision is not None
        out = []
        for message in messages:
            content = message["content"]
            if isinstance(content, str):
                content = self.vision.escaped(content)
            else:
                content = [
                    {"type": "image"} if part["type"] == "image_url" else {"type": "text", "text": self.vision.escaped(part["text"])}
                    for part in content
                ]
            out.append({**message, "content": content})
        return out

    def cut_at_placeholder(self, plan: CallPlan, generation: Generation) -> Generation:
        """A vision policy's completion that sampled an image placeholder, cut after it (trained,
        read as padding); its sample then takes no further call, as the harness ends such an episode."""
        at = None if self.vision is None else self.vision.sampled_placeholder(generation.token_ids)
        if at is None:
            return generation
        if plan.media is not None:
            plan.media.ended = True
        logprobs = None if generation.logprobs is None else list(generation.logprobs)[: at + 1]
        return replace(generation, token_ids=list(generation.token_ids)[: at + 1], logprobs=logprobs, finish_reason="length")

    def plan_text(self, prompt: str) -> CallPlan:
        """The prompt of a completions call: the sample whose text it extends plus the new text's
        ids, or the prompt encoded afresh."""
        with self._lock:
            best = None
            for sample in self._samples:
                text = sample.history
                if isinstance(text, str) and prompt.startswith(text) and (best is None or len(text) > len(best.history)):
                    best = sample
            if best is None:
                return CallPlan(self.renderer.encode(prompt), None, history=prompt)
            traj = best.trajectory
            rest = prompt[len(best.history) :]
            ids = self.renderer.encode(rest) if rest else []
            return CallPlan(traj.token_ids + ids, best, len(traj.token_ids), prompt)

    def plan_tokens(self, ids: list[int]) -> CallPlan:
        """The prompt of a completions call sent as token ids: exactly those ids. It extends the
        sample whose tokens (prompts and completions, as generated) begin it, whatever made that
        sample; else it starts one."""
        with self._lock:
            best = None
            for sample in self._samples:
                tokens = sample.trajectory.token_ids
                if (
                    not sample.ended and len(tokens) <= len(ids) and ids[: len(tokens)] == tokens
                    and (best is None or len(tokens) > len(best.trajectory.token_ids))
                ):
                    best = sample
            if best is None:
                return CallPlan(list(ids), None, history=tuple(ids))
            return CallPlan(list(ids), best, len(best.trajectory.token_ids), tuple(ids))

    # -- recording a call ---------------------------------------------------------------------

    def record(self, plan: CallPlan, generation: Generation, reply: Any, elapsed_s: float) -> None:
        """Append a finished call's completion to its sample (``reply``: the assistant message, or
        the completion's text, that the program was given; its ids for a prompt of token ids)."""
        ids = list(generation.token_ids)
        with self._lock:
            if self._closed:  # a call still generating when its episode ended: not trained on
                return
            turn = self._turn
            self._turn += 1
            self.calls += 1
            self.call_s += elapsed_s
            self.generated_tokens += len(ids)
            sample = plan.sample
            if sample is not None and len(sample.trajectory.token_ids) == plan.base_len:
                traj = sample.trajectory
                new_prompt = plan.prompt_ids[plan.base_len :]
                prompt_turn = sample.last_turn
            else:  # a new sample; or a fork of one that another call extended meanwhile
                traj = Trajectory()
                new_prompt = plan.prompt_ids
                sample = _Sample(traj, [], plan.tools)
                self._samples.append(sample)
                prompt_turn = -1
            if plan.media is not None:
                traj.media = plan.media
                sample.ended = plan.media.ended
            _extend(traj, new_prompt, ids, generation, turn, prompt_turn)
            sample.last_turn = turn
            if isinstance(plan.history, list):
                sample.history = [*plan.history, reply]
                self.last_chat = sample.history
            else:
                sample.history = plan.history + reply

    @property
    def num_samples(self) -> int:
        return len(self._samples)

    def trajectories(self) -> list[Trajectory]:
        """The episode's samples, oldest first; each carries the episode id the program was given
        (``AGILERL_EPISODE``), which its rollout records show. The episode is closed: a call that
        finishes later changes nothing."""
        with self._lock:
            self._closed = True
            out = [s.trajectory for s in self._samples]
        for traj in out:
            traj.episode = self.id
        return out

    @property
    def turns(self) -> int:
        return self._turn

    def check_budget(self) -> None:
        """Refuse a call past ``max_calls`` (the manifest's ``max_turns``)."""
        if self.max_calls is not None and self.calls + self.in_flight >= self.max_calls:
            raise InvalidArgument(f"this episode has made its {self.max_calls} calls (max_turns)")


def _extend(traj: Trajectory, prompt: list[int], completion: list[int], generation: Generation, turn: int, prompt_turn: int) -> None:
    """Append a call's new prompt tokens (masked out) and its completion (trained)."""
    if generation.logprobs is not None or traj.logprobs is not None:
        if traj.logprobs is None:
            traj.logprobs = [0.0] * len(traj.token_ids)
        traj.logprobs += [0.0] * len(prompt)
        traj.logprobs += list(generation.logprobs) if generation.logprobs is not None else [0.0] * len(completion)
    if generation.version is not None or traj.versions is not None:
        if traj.versions is None:
            traj.versions = [-1] * len(traj.token_ids)
        traj.versions += [-1] * len(prompt)
        traj.versions += [generation.version if generation.version is not None else -1] * len(completion)
    traj.token_ids += prompt + completion
    traj.action_mask += [False] * len(prompt) + [True] * len(completion)
    traj.turn_ids += [prompt_turn] * len(prompt) + [turn] * len(completion)


def continuation_ids(
    renderer: ChatRenderer,
    reply: dict[str, Any],
    new: list[dict[str, Any]],
    completion_ids: Sequence[int],
    calls_end: str | None = None,
) -> list[int]:
    """The ids the template puts after ``reply`` (the assistant message a call was given) for the
    ``new`` messages, then the generation prompt; without what the completion already wrote (its
    stop token). One plain message after a plain reply (a chat loop's next turn) is the harness's
    memoised turn tail; anything else is rendered."""
    if not reply.get("tool_calls") and len(new) == 1 and new[0].keys() == {"role", "content"}:
        tail = list(renderer.turn_tail_ids(new[0]["role"], new[0]["content"], final=False))
        return _without_overlap(renderer, completion_ids, tail)
    return _without_overlap(renderer, completion_ids, renderer.encode(continuation_text(renderer, reply, new, calls_end)))


def continuation_text(
    renderer: ChatRenderer, reply: dict[str, Any], new: list[dict[str, Any]], calls_end: str | None = None
) -> str:
    """The text the template puts after ``reply``'s content for the ``new`` messages, then the
    generation prompt: a render of a short conversation (an opening, the reply, the new
    messages), from where the reply's answer ends."""
    refusals: list[Exception] = []
    for base in _BASES:
        try:
            prompt = renderer.render_text(base, add_generation_prompt=True)
            after = renderer.render_text([*base, reply, *new], add_generation_prompt=True)
        except (ChatTemplateError, TypeError) as exc:
            refusals.append(exc)
            continue
        start = len(os.path.commonprefix([prompt, after]))
        end = after.rfind(calls_end, start) if calls_end and reply.get("tool_calls") else -1
        if end >= 0:
            end += len(calls_end or "")
        elif renderer.assistant_close:
            end = after.find(renderer.assistant_close, start + len(reply.get("content") or ""))
            if end < 0:
                end = after.find(renderer.assistant_close, start)
        if end < 0:
            raise ChatTemplateError(
                f"the chat template's render of an answer holds no {renderer.assistant_close!r}: where "
                "the answer ends, and the new messages start, cannot be found"
            )
        return after[end:]
    raise ChatTemplateError(f"the chat template cannot render these messages after an answer: {refusals[0]}")


def _without_overlap(renderer: ChatRenderer, completion_ids: Sequence[int], tail: list[int]) -> list[int]:
    """``tail`` less the turn close the model already wrote as its stop token."""
    if completion_ids and tail and tail[0] == completion_ids[-1] == renderer.end_of_turn_id:
        return tail[1:]
    return tail


def _images(messages: list[dict[str, Any]]) -> list[EnvImage]:
    """The images ``messages`` show, in order (``data:`` URLs: the endpoint fetches nothing)."""
    return [
        EnvImage.from_data_url(part["url"])
        for message in messages if isinstance(message["content"], list)
        for part in message["content"] if part["type"] == "image_url"
    ]


def _extended(media: VisionMedia | None) -> VisionMedia:
    """A copy of a sample's media that a call may add images to (the sample keeps its own until
    the call is recorded)."""
    if media is None:
        return VisionMedia()
    return replace(
        media, images=list(media.images), chunks=list(media.chunks),
        placeholder_counts=list(media.placeholder_counts), image_turns=list(media.image_turns),
    )
