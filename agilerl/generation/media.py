"""The images a policy generates with: what an episode's image turns left in tensor form.

``VisionMedia`` is one trajectory's (each image turn's processor output, kept in place, and where
its placeholders lie in the ids); ``BatchMedia`` is a batch's concatenation, handed to the model
beside the ids. ``rollout.vision`` builds them; policies, the trainer and the vLLM engines read them.

The model's processor travels with its tokenizer (``attach_processor``), so every part that needs
only token facts (pad ids, stop tokens, decoding) keeps the tokenizer it had.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from agilerl.errors import InvalidArgument
from agilerl.images import EnvImage, ImageLimits

if TYPE_CHECKING:
    import torch

__all__ = [
    "attach_processor",
    "limit_images",
    "processor_of",
    "split_processor",
    "VisionMedia",
    "BatchMedia",
    "ImageTurn",
]

_ATTRIBUTE = "vision_processor"


def _is_processor(obj: Any) -> bool:
    return hasattr(obj, "image_processor") and hasattr(obj, "tokenizer")


def attach_processor(processor: Any) -> Any:
    """The processor's tokenizer, carrying the processor (read back by ``processor_of``): what a
    vision model's loader returns as its tokenizer."""
    if not _is_processor(processor):
        raise InvalidArgument(f"{type(processor).__name__} is not a multimodal processor (no image_processor)")
    tokenizer = processor.tokenizer
    if getattr(tokenizer, "chat_template", None) is None and getattr(processor, "chat_template", None):
        tokenizer.chat_template = processor.chat_template
    setattr(tokenizer, _ATTRIBUTE, processor)
    return tokenizer


def processor_of(tokenizer: Any) -> Any | None:
    """The multimodal processor a tokenizer carries (``attach_processor``), or None."""
    return getattr(tokenizer, _ATTRIBUTE, None)


def limit_images(tokenizer: Any, limits: ImageLimits) -> None:
    """Bound the images a vision model's conversations may hold (nothing for a text tokenizer)."""
    processor = processor_of(tokenizer)
    if processor is not None:
        processor.agilerl_image_limits = limits
        processor._agilerl_vision_turns = None  # rebuilt with the new limits


def split_processor(tokenizer_or_processor: Any) -> tuple[Any, Any | None]:
    """``(tokenizer, processor or None)`` of what a harness was given: a tokenizer (carrying a
    processor or not) or a processor itself."""
    if _is_processor(tokenizer_or_processor):
        return attach_processor(tokenizer_or_processor), tokenizer_or_processor
    return tokenizer_or_processor, processor_of(tokenizer_or_processor)


def _image_axis(key: str, value: Any) -> int:
    """The axis a processor output's images lie along: 0 (Qwen2-VL's patches and grids, LLaVA's
    images), or 1 for outputs with a batch axis first (Idefics3/SmolVLM's pixel_values and
    pixel_attention_mask: the model flattens that axis into its images)."""
    return 1 if value.ndim == 5 or key == "pixel_attention_mask" else 0


@dataclass(frozen=True)
class ImageTurn:
    """One image turn's text as rendered (one placeholder per image, as the chat template wrote
    it) and where its placeholder ids lie among the ``length`` ids the processor made of it:
    from ``anchor`` to ``anchor + extent``."""

    text: str
    anchor: int
    extent: int
    length: int


@dataclass(frozen=True)
class _EngineSpan:
    """Where an image turn's ids differ from its text unexpanded: ``length`` ids from ``start``
    in the episode's ids are ``written`` there instead. ``placeholders_end``: where its
    placeholder ids end (the next turn's are looked for after it)."""

    start: int
    length: int
    written: tuple[int, ...]
    placeholders_end: int


@dataclass
class VisionMedia:
    """An episode's images and their processor tensors, in the order their placeholders appear."""

    images: list[EnvImage] = field(default_factory=list)
    chunks: list[dict[str, Any]] = field(default_factory=list)
    """One processor output per image turn (its tensors without the text's)."""
    image_token_ids: tuple[int, ...] = ()
    """Image tokens, for models that take per-token modality types (``mm_token_type_ids``:
    transformers 5's Qwen2-VL family), rebuilt from the ids for any batch; empty otherwise."""
    placeholder_counts: list[int] = field(default_factory=list)
    """Placeholder tokens each chunk's turn holds (to cut an episode between turns)."""
    placeholder_ids: tuple[int, ...] = ()
    image_turns: list[ImageTurn] = field(default_factory=list)
    """Per chunk: its text and where its placeholders lie (``engine_ids``)."""
    encode: Any = None
    """The tokenizer's encoding of text, without special tokens (``engine_ids``)."""
    ended: bool = False
    """The model sampled a placeholder: the episode ends at that turn."""
    _engine_spans: list[_EngineSpan] = field(default_factory=list, init=False, repr=False, compare=False)
    """Each image turn's difference from its text unexpanded, found at the first ``engine_ids``
    that holds the turn (only a vLLM policy asks: nothing is spent for the others)."""

    def cut(self, token_ids: Sequence[int], action_mask: Sequence[bool]) -> VisionMedia:
        """The media of an episode cut to ``token_ids``: the image turns whose placeholders it
        still holds (a cut falls between turns, after an action)."""
        placeholders = frozenset(self.placeholder_ids)
        kept = sum(1 for t, generated in zip(token_ids, action_mask) if t in placeholders and not generated)
        n, total = 0, 0
        for count in self.placeholder_counts:
            if total + count > kept:
                break
            total += count
            n += 1
        images = sum(_images_in(chunk) for chunk in self.chunks[:n])
        return replace(
            self, images=self.images[:images], chunks=self.chunks[:n], placeholder_counts=self.placeholder_counts[:n],
            image_turns=self.image_turns[: sum(1 for count in self.placeholder_counts[:n] if count)],
        )

    def engine_ids(self, ids: Sequence[int]) -> list[int]:
        """``ids`` as an inference engine that expands images itself takes them (vLLM): each image
        turn as the chat template wrote it, one placeholder per image. The engine expands it with
        the pictures, as the processor did, back to ``ids``.

        Each turn is found once, in order (an episode only grows), by its first placeholder id:
        no placeholder id lies outside the image turns (env text is escaped, and a sampled one ends
        the episode). A prompt taken before later image turns holds only the turns before its end."""
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        spans = self._engine_spans
        if len(spans) < len(self.image_turns):
            placeholders = frozenset(self.placeholder_ids)
            at = spans[-1].placeholders_end if spans else 0
            for k in range(len(spans), len(self.image_turns)):
                turn = self.image_turns[k]
                anchor = next((i for i in range(at, len(ids)) if ids[i] in placeholders), None)
                if anchor is None:
                    break  # this prompt ends before image turn k
                start = anchor - turn.anchor
                end = anchor + turn.extent
                if start < at or start + turn.length > len(ids) or ids[end - 1] not in placeholders:
                    raise InvalidArgument(f"image turn {k}'s placeholder ids are not where the episode's media says")
                spans.append(_difference(ids[start : start + turn.length], self.encode(turn.text), start, end))
                at = end
        out: list[int] = []
        at = 0
        for span in spans:
            if span.start >= len(ids):
                break
            out += ids[at : span.start]
            out += span.written
            at = span.start + span.length
        out += ids[at:]
        return out

    @property
    def num_images(self) -> int:
        return len(self.images)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The model's image inputs for this episode alone (``pixel_values``, ...)."""
        return _concatenated([self])

    def checksums(self) -> list[str]:
        """Each image's pixel checksum: equal in process and over the wire."""
        return [image.checksum() for image in self.images]


def _difference(expanded: list[int], written: list[int], start: int, placeholders_end: int) -> _EngineSpan:
    """Where an image turn's ids (``expanded``, from ``start`` in the episode's) differ from the
    tokenizer's ids of its text (``written``): from the first id that differs to the last (Gemma
    3's newlines around the image included)."""
    shorter = min(len(expanded), len(written))
    prefix = next((i for i in range(shorter) if expanded[i] != written[i]), shorter)
    room = shorter - prefix
    suffix = next((i for i in range(room) if expanded[-1 - i] != written[-1 - i]), room)
    return _EngineSpan(
        start=start + prefix, length=len(expanded) - suffix - prefix,
        written=tuple(written[prefix : len(written) - suffix]), placeholders_end=placeholders_end,
    )


def _images_in(chunk: dict[str, Any]) -> int:
    grid = chunk.get("image_grid_thw")
    if grid is not None:
        return int(grid.shape[0])
    values = chunk["pixel_values"]
    return int(values.shape[_image_axis("pixel_values", values)])


def _concatenated(media: Sequence[VisionMedia | None]) -> dict[str, Any]:
    import torch

    parts: dict[str, list[Any]] = {}
    for item in media:
        for chunk in item.chunks if item is not None else ():
            for key, value in chunk.items():
                parts.setdefault(key, []).append(value)
    return {key: torch.cat(values, dim=_image_axis(key, values[0])) for key, values in parts.items()}


class BatchMedia:
    """The images of a batch's rows (None for a text row): sliced by rows like the batch's tensors,
    moved with it, and handed to the model as one concatenation (``model_inputs``).

    ``sampled`` marks placeholder ids the policy generated: the model reads them as padding (they
    have no picture), while their log-probs are still scored and trained.
    """

    def __init__(self, rows: Sequence[VisionMedia | None], sampled: torch.Tensor, pad_id: int, device: Any = None) -> None:
        self.rows = list(rows)
        self.sampled = sampled
        self.pad_id = pad_id
        self.device = device
        self.image_token_ids = next((m.image_token_ids for m in self.rows if m is not None and m.image_token_ids), ())

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.rows),)

    def __getitem__(self, index: slice) -> BatchMedia:
        return BatchMedia(self.rows[index], self.sampled[index], self.pad_id, self.device)

    def to(self, device: Any) -> BatchMedia:
        return BatchMedia(self.rows, self.sampled.to(device), self.pad_id, device)

    def model_inputs(self, input_ids: torch.Tensor) -> dict[str, Any]:
        """The keywords of the model's forward for these rows: ``input_ids`` (sampled placeholders
        read as padding) and the image tensors."""
        import torch

        tensors = _concatenated(self.rows)
        if self.device is not None:
            tensors = {key: value.to(self.device) for key, value in tensors.items()}
        if self.sampled.shape == input_ids.shape and self.sampled.any():
            input_ids = input_ids.masked_fill(self.sampled, self.pad_id)
        if self.image_token_ids:
            ids = torch.tensor(self.image_token_ids, dtype=input_ids.dtype, device=input_ids.device)
            tensors["mm_token_type_ids"] = torch.isin(input_ids, ids).long()
        return {"input_ids": input_ids, **tensors}

    @classmethod
    def for_prompts(cls, media: Sequence[VisionMedia | None], pad_id: int) -> BatchMedia | None:
        """The media of a batch of prompts to generate from (None when none shows an image)."""
        import torch

        if all(m is None or not m.chunks for m in media):
            return None
        return cls(media, torch.zeros((len(media), 1), dtype=torch.bool), pad_id)

    @classmethod
    def collate(
        cls, media: Sequence[VisionMedia | None], input_ids: torch.Tensor, action_mask: torch.Tensor, pad_id: int
    ) -> BatchMedia | None:
        """The batch's media (None when no row shows an image and none sampled a placeholder)."""
        import torch

        placeholder_ids = sorted({i for m in media if m is not None for i in m.placeholder_ids})
        sampled = action_mask & torch.isin(input_ids, torch.tensor(list(placeholder_ids), dtype=input_ids.dtype))
        if all(m is None or not m.chunks for m in media) and not sampled.any():
            return None
        return cls(media, sampled, pad_id)
