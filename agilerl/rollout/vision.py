"""Image turns in token space: what the harness does with an observation that shows pictures.

A vision-language model's processor owns two facts the harness must not guess: the text its chat
template writes for an image (Qwen2-VL's ``<|vision_start|><|image_pad|><|vision_end|>``,
LLaVA's and SmolVLM's ``<image>``), and how many tokens that placeholder becomes for one image
of a given size. So an image turn is rendered by the template (the message with image parts) and
tokenized by the processor itself, on that turn's text and images only: the ids are the
processor's expansion, token for token, and the turn costs the same at turn 200 as at turn 1.
Its tensors (``pixel_values``, plus ``image_grid_thw`` for the Qwen2-VL family) ride on the
trajectory as ``VisionMedia``, earlier turns' kept in place; a batch of trajectories hands the
model one concatenation (``BatchMedia``).

Text an env writes can contain a placeholder's characters: they are escaped (a zero-width space
after the first character), so the model reads them as text and no image slot is forged. A
placeholder the model samples ends its episode (``RolloutHarness``): there is no picture for it.

The model's processor travels with its tokenizer (``attach_processor``), so every part that needs
only token facts (pad ids, stop tokens, decoding) keeps the tokenizer it had.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agilerl.errors import EnvProtocolError, InvalidArgument
from agilerl.generation.media import ImageTurn, VisionMedia, split_processor
from agilerl.images import EnvImage, ImageLimits, ImageObservation, observation_images, observation_text

if TYPE_CHECKING:
    from agilerl.chat import ChatRenderer

__all__ = [
    "VisionTurns",
    "ESCAPE",
    "image_parts",
    "text_only",
]

ESCAPE = "\u200b"
"""Put after the first character of a placeholder an env wrote: the text stays readable, and no
longer matches the special token."""
_TEXT_KEYS = frozenset({"input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids"})


class VisionTurns:
    """Renders and tokenizes image turns for one model (its processor), within ``limits``.

    Shared by every harness over the same renderer; it holds no episode state (that lives on the
    trajectory's ``VisionMedia``).
    """

    def __init__(self, processor: Any, tokenizer: Any, limits: ImageLimits | None = None) -> None:
        self.processor = processor
        self.tokenizer = tokenizer
        self.limits = limits or ImageLimits()
        self.image_token: str = _image_token(processor)
        self.placeholder_strings, self.placeholder_ids = self._learn_placeholders()
        """Every special token an image's expansion uses: escaped in env text, and ending the
        episode when the model samples one."""
        self._placeholder_set = frozenset(self.placeholder_ids)
        self._first_chars = frozenset(p[0] for p in self.placeholder_strings)

    @classmethod
    def of(cls, tokenizer_or_processor: Any) -> VisionTurns | None:
        """The renderer of image turns for a processor (given, or carried by a tokenizer), made
        once per processor; None for a text-only tokenizer."""
        tokenizer, processor = split_processor(tokenizer_or_processor)
        if processor is None:
            return None
        turns = getattr(processor, "_agilerl_vision_turns", None)
        if turns is None:
            turns = cls(processor, tokenizer, getattr(processor, "agilerl_image_limits", None))
            processor._agilerl_vision_turns = turns
        return turns

    def opening(
        self, renderer: ChatRenderer, chat: Any, prompt: str | ImageObservation, info: dict[str, Any],
        media: VisionMedia, where: str,
    ) -> list[int]:
        """Ids of a reset's opening (``EpisodeChat.opening``), its images in the user's message."""
        if isinstance(prompt, str):
            return renderer.prompt_ids(chat.opening(self.escaped(prompt), info))
        return self.opening_ids(renderer, chat.opening(prompt.text, info), prompt, media, where)

    def tail(
        self, renderer: ChatRenderer, role: str, observation: str | ImageObservation, *, final: bool,
        media: VisionMedia, where: str,
    ) -> list[int]:
        """Ids after a completion: ``ChatRenderer.turn_tail_ids`` for text (escaped), the
        processor's for images."""
        if isinstance(observation, str):
            return renderer.turn_tail_ids(role, self.escaped(observation), final=final)
        return self.tail_ids(renderer, role, observation, final=final, media=media, where=where)

    def end_at_placeholder(
        self, trajectory: Any, ids: list[int], logprobs: Sequence[float] | None, at: int
    ) -> tuple[list[int], Sequence[float] | None]:
        """A completion cut after the placeholder it sampled at ``at`` (kept: it is trained); the
        episode ends with this turn."""
        trajectory.media.ended = True
        trajectory.info["ended_by"] = "sampled image placeholder"
        return ids[: at + 1], None if logprobs is None else list(logprobs)[: at + 1]

    # -- what the env wrote ---------------------------------------------------------------------

    def escaped(self, text: str) -> str:
        """``text`` with every placeholder it contains escaped (``ESCAPE``)."""
        if not any(first in text for first in self._first_chars):
            return text
        for placeholder in self.placeholder_strings:
            if placeholder in text:
                text = text.replace(placeholder, placeholder[0] + ESCAPE + placeholder[1:])
        return text

    def content(self, observation: str | ImageObservation) -> str | list[dict[str, Any]]:
        """A message's content: escaped text, or image parts then the escaped text's part."""
        text = self.escaped(observation_text(observation))
        images = observation_images(observation)
        if not images:
            return text
        return [*({"type": "image"} for _ in images), {"type": "text", "text": text}]

    def sampled_placeholder(self, ids: Sequence[int]) -> int | None:
        """The index of the first placeholder id among generated ``ids``, or None."""
        placeholders = self._placeholder_set
        return next((i for i, token in enumerate(ids) if token in placeholders), None)

    # -- tokens -----------------------------------------------------------------------------------

    def opening_ids(
        self, renderer: ChatRenderer, messages: list[dict[str, Any]], observation: str | ImageObservation,
        media: VisionMedia, where: str,
    ) -> list[int]:
        """Ids of an opening whose last user message shows ``observation``'s images."""
        messages = [dict(m) for m in messages]
        for message in reversed(messages):
            if message.get("role") == "user":
                message["content"] = self.content(observation)
                break
        text = renderer.render_text(messages, add_generation_prompt=True)
        return self.tokens(text, observation_images(observation), media, where)

    def tail_ids(
        self, renderer: ChatRenderer, role: str, observation: str | ImageObservation, *, final: bool,
        media: VisionMedia, where: str,
    ) -> list[int]:
        """Ids after a completion (as ``ChatRenderer.turn_tail_ids``) for an observation with images."""
        message = {"role": role, "content": self.content(observation)}
        body = renderer.assistant_close + renderer.appended_text(message, images_before=media.num_images)
        ids = self.tokens(body, observation_images(observation), media, where)
        return ids if final else ids + renderer.encode(renderer.generation_prompt)

    def tokens(self, text: str, images: Sequence[EnvImage], media: VisionMedia, where: str) -> list[int]:
        """``text`` (holding one placeholder per image) tokenized by the processor with
        ``images``: their tensors are appended to ``media``. Limits are checked first."""
        for image in images:
            self.limits.check_image(image, where)
        self.limits.check_count(media.num_images + len(images), where)
        if not images:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        try:
            out = self.processor(
                text=[text], images=[image.pil() for image in images], add_special_tokens=False, return_tensors="pt"
            )
        except ValueError as exc:  # an image the processor takes no part of (Qwen2-VL: an aspect ratio past 200)
            sizes = ", ".join(f"{image.width}x{image.height}" for image in images)
            raise EnvProtocolError(f"{where}: the model's processor refused the image ({sizes}): {exc}") from exc
        ids = out["input_ids"][0].tolist()
        media.images.extend(images)
        media.chunks.append({key: value for key, value in out.items() if key not in _TEXT_KEYS and hasattr(value, "ndim")})
        inside = [i for i, token in enumerate(ids) if token in self._placeholder_set]
        media.placeholder_counts.append(len(inside))
        if inside:  # a processor that wrote no placeholder: the chunk is text to an engine too
            media.image_turns.append(ImageTurn(text, inside[0], inside[-1] + 1 - inside[0], len(ids)))
        media.encode = self._encode
        media.placeholder_ids = self.placeholder_ids
        if "mm_token_type_ids" in out and not media.image_token_ids:
            media.image_token_ids = (self.tokenizer.convert_tokens_to_ids(self.image_token),)
        return ids

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _learn_placeholders(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The special tokens one image expands to (found by expanding a probe), longest first."""
        from PIL import Image

        probe = Image.new("RGB", (32, 32), (127, 127, 127))
        out = self.processor(text=[self.image_token], images=[probe], add_special_tokens=False)
        special = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        added = {i for i in getattr(self.tokenizer, "added_tokens_decoder", {}) or {}}
        ids = {int(i) for i in out["input_ids"][0]} & (special | added)
        ids |= self._template_image_ids() & (special | added)
        ids |= {i for name in ("image_token", "video_token", "audio_token")
                if isinstance(token := getattr(self.processor, name, None), str)
                and (i := self.tokenizer.convert_tokens_to_ids(token)) is not None and i >= 0}
        strings = {self.tokenizer.convert_ids_to_tokens(i) for i in ids}
        for name in ("image_token", "video_token", "audio_token", "boi_token", "eoi_token"):
            value = getattr(self.processor, name, None)
            if isinstance(value, str) and value:
                strings.add(value)
        return tuple(sorted(strings, key=len, reverse=True)), tuple(sorted(ids))


    def _template_image_ids(self) -> set[int]:
        """The special tokens the chat template writes around an image (Qwen2-VL's
        ``<|vision_start|>``/``<|vision_end|>``): in an image message, not in the same without it."""
        from agilerl.chat import render_chat

        def ids(content: list[dict[str, Any]]) -> set[int]:
            text = render_chat(self.tokenizer, [{"role": "user", "content": content}])
            return set(self.tokenizer.encode(text, add_special_tokens=False))

        text_part = {"type": "text", "text": "x"}
        try:
            return ids([{"type": "image"}, text_part]) - ids([text_part])
        except Exception:  # a template that takes no parts: the processor's tokens are all there is
            return set()


_DEFAULT_LIMITS = ImageLimits()


def _image_token(processor: Any) -> str:
    token = getattr(processor, "image_token", None)
    if not isinstance(token, str) or not token:
        raise InvalidArgument(f"{type(processor).__name__} names no image_token: it cannot render image turns")
    return token


def image_parts(observation: str | ImageObservation, limits: ImageLimits | None = None) -> str | list[dict[str, Any]]:
    """An observation as an OpenAI chat message's content, for a policy behind a chat endpoint
    that reads images itself: its text, or an ``image_url`` part (a data URL) per image, then a
    text part. Each image's size is checked (``limits``: the defaults) before it is encoded."""
    images = observation_images(observation)
    if not images:
        return observation_text(observation)
    for image in images:
        (limits or _DEFAULT_LIMITS).check_image(image, "an observation for the chat endpoint")
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": image.data_url()}} for image in images]
    return [*parts, {"type": "text", "text": observation_text(observation)}]


def text_only(observation: str | ImageObservation, env_name: str) -> str:
    """``observation`` when it is text; an error naming the env when it shows images to a model
    that has no image processor."""
    if type(observation) is str:
        return observation
    if isinstance(observation, str):
        return str(observation)
    raise EnvProtocolError(
        f"{env_name} returned an image observation, but the model has no image processor: train a "
        "vision-language model (model.name_or_path: tiny-vlm, or a hub VLM loaded with its "
        "AutoProcessor), or pass the processor as the harness's tokenizer"
    )
