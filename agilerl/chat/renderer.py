"""Incremental chat templating: render only what is new each turn, yet token for token the same
as rendering the whole conversation once.

Rendering the full chat every turn is quadratic in turns. Instead we learn, once per tokenizer, how
the template wraps one appended message (the text before and after its content), and check that
the shortcut reproduces the template on a probe. Templates that transform content (Llama 3 trims
it) fail the probe and fall back to rendering just the new message against a fixed two-message
context: still constant work per turn.

A conversation's opening (system and user messages) is filled into the template's learned text
the same way, so a new prompt costs one encode, not a template render.

Templates that refuse a system message or insist on alternating roles (Gemma 2, early Mistral)
are learned against a conversation they accept, with observations after an answer. A trailer
some templates put after a finished conversation (Phi-3's eos) belongs to no turn: it is left out.

Some templates rewrite earlier turns as a conversation goes on (Qwen3 drops old thinking and
empty think blocks; Mistral v0.3 moves the tool list to the newest user turn). No full render
then shows what the model saw at each turn; conversations are built append-only, which is what
the model saw and generated, and a warning says so. A moved tool list stays where the model first
saw it; later turns are appended as the template renders them without it.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from typing import Any

from agilerl.errors import AgileRLWarning, ChatTemplateError

__all__ = ["render_chat", "split_at_sentinels", "ChatRenderer"]

# Conversations to learn the template against, ending in a user turn; the first that works is
# used (Gemma 2 and early Mistral templates refuse a system message; Mistral v0.3 moves it to the
# newest user turn).
_BASES = (
    [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
    [{"role": "user", "content": "u"}],
)
_ANSWER = {"role": "assistant", "content": "a"}
_SENTINEL = "\x00AGILERL_CONTENT\x00"
_PROBE = "  probe\n text  "
_PROMPT_CACHE_SIZE = 4096
_CACHED_OBSERVATION_CHARS = 512
_OPENING_ROLES = frozenset({"system", "user"})
_TOOL_SETS_KEPT = 64


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = False,
    **template_kwargs: Any,
) -> str:
    """``apply_chat_template`` as text; a template's refusal (``raise_exception``, an undefined
    variable) is a ``ChatTemplateError`` naming the roles, not a bare jinja error."""
    if getattr(tokenizer, "chat_template", None) is None and "chat_template" not in template_kwargs:
        raise ChatTemplateError(
            "the tokenizer has no chat template (is it a base model's?): use an instruct model, or "
            "set tokenizer.chat_template to the template the model should see"
        )
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs
        )
    except Exception as exc:
        from jinja2 import TemplateError

        if not isinstance(exc, TemplateError):
            raise
        roles = ", ".join(str(m.get("role")) for m in messages)
        raise ChatTemplateError(f"the chat template refused a conversation of roles [{roles}]: {exc}") from None


def split_at_sentinels(text: str, sentinels: Sequence[str]) -> list[str] | None:
    """``text`` cut at each sentinel, in order (the template's text around each placed content);
    None when one is missing or repeated: the template altered what it was given."""
    pieces = []
    for sentinel in sentinels:
        before, found, text = text.partition(sentinel)
        if not found or sentinel in text:
            return None
        pieces.append(before)
    pieces.append(text)
    return pieces


class ChatRenderer:
    """Turns messages into token ids with a tokenizer's chat template, one increment at a time."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self.tools = tools or None
        self.template_kwargs = dict(chat_template_kwargs or {})
        # renderers of the same tokenizer and kwargs for other tool sets, shared by the family
        self._family: dict[str, ChatRenderer] = {_tools_key(self.tools): self}
        self._roles: dict[str, bool] = {}
        self._prompt_cache: dict[tuple[tuple[str, str], ...], list[int]] = {}
        self._bodies: dict[tuple[str, str], list[int]] = {}  # (role, observation): close + message
        self._warmed: dict[tuple[str, str], list[int]] = {}  # long observations, encoded ahead once
        self._openings: dict[tuple[str, ...], list[str] | None] = {}
        self._clean_up_spaces = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
        self.content_parts = self._renders_only_parts()
        """The template reads a message's content as a list of parts only (SmolVLM's, LLaVA's:
        a plain string renders as nothing), so every text goes to it as one text part."""
        refusals = []
        for base in _BASES:
            try:
                assistant_open = self._learn(base)
                break
            except ChatTemplateError as exc:
                refusals.append(exc)
        else:
            raise refusals[0]
        self.full_render_identical = self._appending_is_rendering(assistant_open)
        """False for templates whose render of a whole conversation differs from the turns
        appended (Qwen3 drops old thinking and empty think blocks from history): conversations are
        then append-only, exactly the tokens the model saw and generated."""
        if not self.full_render_identical:
            warnings.warn(
                "the chat template renders a conversation differently from how it is built turn by "
                "turn (Qwen3's drops old thinking; Mistral's, SmolVLM's and LLaVA-1.5's put a space "
                "before answers that their generation prompt lacks): trajectories are the tokens the "
                "model saw and generated, appended turn by turn, not a full render of the conversation.",
                AgileRLWarning,
                stacklevel=2,
            )
        self._close_ids = self.encode(self.assistant_close)
        self._generation_ids = self.encode(self.generation_prompt)
        self.end_of_turn_id: int | None = self._close_ids[0] if self._close_ids else None

    def with_tools(self, tools: list[dict[str, Any]] | None) -> ChatRenderer:
        """The renderer for episodes that show ``tools``: this one when they are its own, else a
        sibling learned once per tool set and shared by every harness that shares this one."""
        if tools is self.tools or (not tools and self.tools is None):
            return self  # the common case, without serializing the tools
        key = _tools_key(tools or None)
        renderer = self._family.get(key)
        if renderer is None:
            if len(self._family) >= _TOOL_SETS_KEPT:
                self._family.clear()
            renderer = ChatRenderer(self.tokenizer, tools=tools, chat_template_kwargs=self.template_kwargs)
            renderer._family = self._family
            self._family[key] = renderer
        return renderer

    def renders_role(self, role: str) -> bool:
        """Whether the template renders a message of ``role`` after an answer (a template without
        a ``tool`` role may refuse one)."""
        if role not in self._roles:
            try:
                self.message_text(role, "o")
                self._roles[role] = True
            except ChatTemplateError:
                self._roles[role] = False
        return self._roles[role]

    def render_text(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = False) -> str:
        """The template's text for ``messages`` (one full render)."""
        if self.content_parts:
            messages = [_as_parts(m) for m in messages]
        return render_chat(
            self.tokenizer, messages, tools=self.tools, add_generation_prompt=add_generation_prompt, **self.template_kwargs
        )

    def _renders_only_parts(self) -> bool:
        """Whether the template drops (or refuses) a plain string content that it renders as a
        text part: multimodal templates written for lists of parts."""
        def shows(content: Any) -> bool:
            try:
                text = render_chat(self.tokenizer, [{"role": "user", "content": content}], **self.template_kwargs)
            except ChatTemplateError:
                return False
            return _PROBE.strip() in text

        return not shows(_PROBE) and shows([{"type": "text", "text": _PROBE}])

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text; the template already holds any special tokens it wants."""
        if self._backend is not None:  # the same ids, without the wrapper's per-call overhead
            return self._backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        """The text of generated ids, special tokens dropped (as ``tokenizer.decode`` gives it)."""
        if self._backend is not None and not self._clean_up_spaces:
            return self._backend.decode(ids, skip_special_tokens=True)
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of a conversation's opening plus the generation prompt (a fresh list).

        Memoised: every member of a GRPO group, and every epoch, starts from the same messages.
        """
        key = _messages_key(messages)
        cached = self._prompt_cache.get(key) if key is not None else None
        if cached is None:
            cached = self.encode(self._opening_text(messages, key))
            if key is not None:
                _remember(self._prompt_cache, key, cached)
        return list(cached)

    def turn_tail_ids(self, role: str, observation: str, *, final: bool) -> list[int]:
        """Ids after a completion: the assistant turn's close, the observation's message (none
        for an empty final one) and, unless final, the next generation prompt. Do not mutate.

        Memoised for short observations: envs repeat them ("Too high!"), and this encode is most
        of a turn's bookkeeping.
        """
        if final and not observation:
            return self._close_ids
        key = (role, observation)
        body = self._bodies.get(key)
        if body is None:
            body = self._warmed.pop(key, None)
            if body is None:
                body = self.encode(self._body_text(role, observation))
                self._store_body(key, body)
        return body if final else body + self._generation_ids

    def parts_tail_ids(self, role: str, content: list[dict[str, Any]], *, final: bool) -> list[int]:
        """``turn_tail_ids`` for a message of content parts (pictures for a chat endpoint that
        reads them): one template render, not memoised."""
        ids = self.encode(self.assistant_close + self.appended_text({"role": role, "content": content}))
        return ids if final else ids + self._generation_ids

    def warm(
        self,
        openings: Sequence[list[dict[str, Any]]] = (),
        observations: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Encode, in one batch call, what many harnesses are about to ask for: conversation
        openings (for ``prompt_ids``) and ``(role, observation)`` turns (for ``turn_tail_ids``).

        The Rust tokenizer spreads a batch over the cores and pays its per-call cost once: for 64
        new observations a turn, a quarter less time than one by one.
        """
        self._warmed.clear()
        prompts: dict[tuple[tuple[str, str], ...], str] = {}
        for messages in openings:
            key = _messages_key(messages)
            if key is not None and key not in self._prompt_cache and key not in prompts:
                prompts[key] = self._opening_text(messages, key)
        bodies: dict[tuple[str, str], str] = {}
        for role, observation in observations:
            if type(observation) is str and (role, observation) not in self._bodies:  # images: not here
                bodies[role, observation] = self._body_text(role, observation)
        if len(prompts) + len(bodies) < 2 or self._backend is None:
            return  # nothing to share a call with
        # encode_batch_fast (tokenizers >= 0.21) skips the character offsets: about 15% less
        encode_batch = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)
        encoded = encode_batch([*prompts.values(), *bodies.values()], add_special_tokens=False)
        for prompt_key, encoding in zip(prompts, encoded):
            _remember(self._prompt_cache, prompt_key, encoding.ids)
        for body_key, encoding in zip(bodies, encoded[len(prompts) :]):
            if not self._store_body(body_key, encoding.ids):
                self._warmed[body_key] = encoding.ids  # too long to keep: used once, then dropped

    def _body_text(self, role: str, observation: str) -> str:
        """The assistant turn's close and the observation's message, as one text to encode."""
        return self.assistant_close + self.message_text(role, observation)

    def _store_body(self, key: tuple[str, str], ids: list[int]) -> bool:
        """Memoise a short observation's ids (envs repeat those); False for a long one."""
        if len(key[1]) > _CACHED_OBSERVATION_CHARS:
            return False
        _remember(self._bodies, key, ids)
        return True

    def appended_text(self, message: dict[str, Any], *, images_before: int = 0) -> str:
        """The text one appended message adds, by one template render: for content the learned
        wrappers cannot hold (a list of image and text parts). ``images_before``: the pictures
        the conversation already shows, for templates that number them (Qwen2-VL's
        ``add_vision_id``: "Picture 3:"); the context it is rendered after shows as many."""
        if not images_before:
            return self._appended(message)
        key = (message["role"], images_before)
        if key not in self._image_contexts:  # the context showing that many pictures, rendered once
            context = _with_images(self._context(message)[0], images_before)
            self._image_contexts[key] = context, self._closed_text(context)
        context, before = self._image_contexts[key]
        return self._after(context, message, before=before)

    def message_text(self, role: str, content: str) -> str:
        """The text one appended message adds to any conversation."""
        if role not in self._wrappers:
            self._wrappers[role] = self._learn_wrapper(role)
        wrapper = self._wrappers[role]
        if wrapper is None:
            return self._appended({"role": role, "content": content})
        return wrapper[0] + content + wrapper[1]

    def _opening_text(self, messages: list[dict[str, Any]], key: tuple[tuple[str, str], ...] | None) -> str:
        """The rendered opening plus generation prompt: the learned pieces around the contents
        when the template's opening for these roles was learned, else one full render."""
        roles = tuple(role for role, _ in key) if key is not None else ()
        if roles and _OPENING_ROLES.issuperset(roles):
            if roles not in self._openings:
                self._openings[roles] = self._learn_opening(roles)
            pieces = self._openings[roles]
            if pieces is not None:
                return _interleave(pieces, [content for _, content in key or ()])
        return self.render_text(messages, add_generation_prompt=True)

    def _learn_opening(self, roles: tuple[str, ...]) -> list[str] | None:
        """The text between the contents of an opening with these roles, or None when the
        template alters or inspects content (checked on a probe)."""
        sentinels = [f"{_SENTINEL}{i}\x00" for i in range(len(roles))]
        text = self.render_text(
            [{"role": r, "content": c} for r, c in zip(roles, sentinels)], add_generation_prompt=True
        )
        pieces = split_at_sentinels(text, sentinels)
        if pieces is None:
            return None
        probes = [_PROBE.replace("probe", f"probe{i}") for i in range(len(roles))]
        probe = self.render_text([{"role": r, "content": c} for r, c in zip(roles, probes)], add_generation_prompt=True)
        return pieces if probe == _interleave(pieces, probes) else None

    def _appending_is_rendering(self, assistant_open: str) -> bool:
        """Whether a two-turn conversation built turn by turn equals its one full render, for a
        plain answer and one that thinks first (templates that drop old thinking differ there)."""
        if assistant_open != self.generation_prompt:
            return False
        for answer in ("a", "<think>\nt\n</think>\n\na"):
            turns = [*self._base, {"role": "assistant", "content": answer}, {"role": "user", "content": "b"}]
            appended = (
                self._base_text + self.generation_prompt + answer + self.assistant_close
                + self.message_text("user", "b") + self.generation_prompt
            )
            if self.render_text(turns, add_generation_prompt=True) != appended:
                return False
        return True

    def _learn(self, base: list[dict[str, str]]) -> str:
        """Learn the template against ``base`` (a conversation ending in a user turn): the
        generation prompt, how an answer closes, how an observation follows it. Returns the text
        that opens a finished answer; ChatTemplateError when ``base`` does not work."""
        self._base = base
        self._trailer = self._learn_trailer()
        self._base_text = self._closed_text(base)
        self._wrappers: dict[str, tuple[str, str] | None] = {}
        self._contexts: dict[str, tuple[list[dict[str, Any]], str]] = {}  # role: what it follows
        self._image_contexts: dict[tuple[str, int], tuple[list[dict[str, Any]], str]] = {}  # (role, pictures before)
        self.generation_prompt = self._after(base, add_generation_prompt=True)
        asst_delta = self._after(base, {"role": "assistant", "content": _SENTINEL})
        if asst_delta.count(_SENTINEL) != 1:
            raise ChatTemplateError(
                "the chat template does not render an assistant message's content as given, so "
                "where a completion ends cannot be learned; it cannot be used for multi-turn rollouts"
            )
        assistant_open, self.assistant_close = asst_delta.split(_SENTINEL)
        self.message_text("user", "o")  # an observation must be able to follow an answer
        return assistant_open

    def _learn_trailer(self) -> str:
        """What the template puts after a conversation that does not end in a generation prompt
        (Phi-3's eos), found among the special tokens; it belongs to no turn."""
        closed = self.render_text(self._base)
        extended = self.render_text([*self._base, _ANSWER])
        if extended.startswith(closed):
            return ""
        specials = sorted(set(getattr(self.tokenizer, "all_special_tokens", None) or []), key=len, reverse=True)
        for trailer in specials:
            if closed.endswith(trailer) and extended.endswith(trailer) and extended.startswith(closed[: -len(trailer)]):
                return trailer
        return ""  # no trailer explains it: the template rewrites earlier messages (an error later)

    def _closed_text(self, messages: list[dict[str, Any]]) -> str:
        """The template's text for ``messages`` without the end-of-conversation trailer."""
        text = self.render_text(messages)
        return text[: -len(self._trailer)] if self._trailer and text.endswith(self._trailer) else text

    def _after(
        self,
        context: list[dict[str, Any]],
        message: dict[str, Any] | None = None,
        *,
        add_generation_prompt: bool = False,
        before: str | None = None,
    ) -> str:
        """The text ``message`` (or the generation prompt) adds to ``context`` (rendered as
        ``before``, when the caller has it)."""
        before = self._closed_text(context) if before is None else before
        extended = [*context, message] if message else context
        text = (
            self.render_text(extended, add_generation_prompt=True)
            if add_generation_prompt
            else self._closed_text(extended)
        )
        if not text.startswith(before):
            if self.tools is not None:
                # the template moves the tool list to the newest user turn (Mistral v0.3): it stays
                # where the model first saw it, and what follows is appended as rendered without it
                return self.with_tools(None)._after(context, message, add_generation_prompt=add_generation_prompt)
            raise ChatTemplateError(
                "the chat template renders earlier messages differently once a message is appended; "
                "it cannot be rendered incrementally"
            )
        return text[len(before) :]

    def _appended(self, message: dict[str, Any]) -> str:
        """The text an observation ``message`` adds to a conversation (one render: the context
        it follows is rendered once per role)."""
        context, before = self._context(message)
        return self._after(context, message, before=before)

    def _context(self, message: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
        """The conversation ``message`` is rendered after, and its text (found once per role)."""
        role = message["role"]
        if role not in self._contexts:
            self._contexts[role] = self._context_for(message)
        return self._contexts[role]

    def _context_for(self, message: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
        """A conversation ``message`` can follow, and its text: one ending in a user turn or, for
        templates that insist on alternating roles, in an answer (where observations really sit)."""
        refusals = []
        for context in (self._base, [*self._base, _ANSWER]):
            try:
                self._after(context, message)
                return context, self._closed_text(context)
            except ChatTemplateError as exc:
                refusals.append(exc)
        raise refusals[0]

    def _learn_wrapper(self, role: str) -> tuple[str, str] | None:
        """(prefix, suffix) around a message's content, or None when the template alters content."""
        delta = self._appended({"role": role, "content": _SENTINEL})
        if delta.count(_SENTINEL) != 1:
            return None
        prefix, suffix = delta.split(_SENTINEL)
        probe = self._appended({"role": role, "content": _PROBE})
        return (prefix, suffix) if probe == prefix + _PROBE + suffix else None


def _tools_key(tools: list[dict[str, Any]] | None) -> str:
    return json.dumps(tools, sort_keys=True, default=str)


def _remember(cache: dict[Any, list[int]], key: Any, ids: list[int]) -> None:
    if len(cache) >= _PROMPT_CACHE_SIZE:
        cache.clear()
    cache[key] = ids


def _as_parts(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with a plain string content as one text part."""
    content = message.get("content")
    return {**message, "content": [{"type": "text", "text": content}]} if isinstance(content, str) else message


def _with_images(context: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """``context`` with ``count`` pictures shown before the text of its first user message."""
    out = [dict(m) for m in context]
    first = next(m for m in out if m.get("role") == "user")
    text = first.get("content")
    parts = text if isinstance(text, list) else [{"type": "text", "text": text}]
    first["content"] = [*({"type": "image"} for _ in range(count)), *parts]
    return out


def _interleave(pieces: list[str], contents: list[str]) -> str:
    parts = [pieces[0]]
    for content, piece in zip(contents, pieces[1:]):
        parts += (content, piece)
    return "".join(parts)


def _messages_key(messages: list[dict[str, Any]]) -> tuple[tuple[str, str], ...] | None:
    """A hashable key for plain ``{role, content}`` messages; None when they carry anything else."""
    key = []
    for message in messages:
        if len(message) != 2 or not isinstance(message.get("content"), str):
            return None
        key.append((str(message.get("role")), message["content"]))
    return tuple(key)
