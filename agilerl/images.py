"""Images in observations: one value (``EnvImage``) however an env gave the picture.

An env may hand back a ``PIL.Image``, an HxWxC (or HxW) uint8 numpy array, PNG or JPEG bytes, or
a ``data:image/...;base64,`` URL. Each becomes an ``EnvImage`` that keeps what it was given
(encoded bytes stay those bytes, pixels stay pixels) and converts lazily: to encoded bytes for
the wire (PNG for pixels: lossless, so served pixels equal in-process pixels), to RGB pixels
for a processor. Its size is known before anything is copied or decoded: read from the header
for bytes, from the shape for an array, from ``.size`` for a PIL image. So a bound
(``ImageLimits``) is always checked first: by the constructors when the caller has one (the env
server, ``env check``), else by whoever asks for the pixels (the harness, before ``pil()``).
A 100-megapixel broadcast array or a 136 KB PNG bomb costs nothing until then.

Pillow and numpy are imported only when an image appears; without them the error names the
``vision`` extra. An observation with pictures is an ``ImageObservation`` (text + images),
built from the protocol's mapping by ``observation_from``, the one place that shape is read.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agilerl.errors import EnvProtocolError, InvalidArgument, MissingExtra

__all__ = [
    "DEFAULT_MAX_IMAGE_PIXELS",
    "DEFAULT_MAX_IMAGES",
    "ImageLimits",
    "EnvImage",
    "ImageObservation",
    "Observation",
    "observation_from",
    "observation_problem",
    "observation_text",
    "observation_images",
    "image_from_value",
]

DEFAULT_MAX_IMAGE_PIXELS = 2048 * 2048
"""Pixels one image may have: a worst-case PNG of this size still fits the client's frame cap
(64 MiB) after base64, and a VLM processor would resize anything larger anyway."""
DEFAULT_MAX_IMAGES = 16
"""Images one conversation (a prompt) may hold; vLLM's ``limit_mm_per_prompt`` is the same idea."""

_MIME = {"PNG": "image/png", "JPEG": "image/jpeg"}
_MAGIC = ((b"\x89PNG\r\n\x1a\n", "PNG"), (b"\xff\xd8\xff", "JPEG"))


def _pil() -> Any:
    with MissingExtra.translate("an image observation"):
        from PIL import Image

    return Image


@dataclass(frozen=True)
class ImageLimits:
    """The bounds on images: pixels per image and images per prompt (the whole conversation).
    ``setting`` is what a refusal tells the user to raise (the server's flag differs from a run's)."""

    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_images: int = DEFAULT_MAX_IMAGES
    setting: str = "model.max_image_pixels"

    def __post_init__(self) -> None:
        for name in ("max_pixels", "max_images"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidArgument(f"{name} must be an int >= 1, got {value!r}")

    def check_image(self, image: EnvImage, where: str) -> None:
        """``EnvProtocolError`` naming ``where``, the size and the setting when ``image`` is too big."""
        problem = self.size_problem(image.width, image.height)
        if problem is not None:
            raise EnvProtocolError(f"{where}: {problem}")

    def size_problem(self, width: int, height: int) -> str | None:
        """Why an image of this size is refused (None: it is not); read before any pixel is."""
        if width * height <= self.max_pixels:
            return None
        return (
            f"an image of {width}x{height} = {width * height:,} pixels is over "
            f"max_image_pixels={self.max_pixels:,}; send smaller images or raise {self.setting}"
        )

    def check_count(self, count: int, where: str) -> None:
        """``EnvProtocolError`` when a conversation would hold more than ``max_images`` images."""
        if count > self.max_images:
            raise EnvProtocolError(
                f"{where}: the conversation would hold {count} images, over max_images="
                f"{self.max_images}; show fewer images per episode or raise model.max_images"
            )


class EnvImage:
    """One image of an observation: its size, and what it was given (encoded bytes, an array or
    a PIL image), turned into RGB pixels or PNG bytes once, when first asked for. Equal images
    compare equal by their RGB pixels' checksum (identical bytes without decoding)."""

    __slots__ = ("width", "height", "_encoded", "_format", "_pil", "_source", "_digest", "_pixels_png")

    def __init__(
        self, width: int, height: int, *, encoded: bytes | None = None, fmt: str | None = None, pil: Any = None,
        source: Any = None,
    ) -> None:
        self.width = width
        self.height = height
        self._encoded = encoded
        self._format = fmt
        self._pil = pil
        self._source = source  # an array or a PIL image as given: converted by ``pil()``
        self._digest: str | None = None
        self._pixels_png: bytes | None = None

    @property
    def pixels(self) -> int:
        return self.width * self.height

    @property
    def size(self) -> tuple[int, int]:
        """``(width, height)``, as PIL gives it."""
        return self.width, self.height

    @classmethod
    def from_bytes(cls, data: bytes, limits: ImageLimits | None = None) -> EnvImage:
        """PNG or JPEG bytes, kept as given; the size is read from the header only (a bomb is
        refused by ``limits`` here, or by Pillow's own bound, never decoded)."""
        fmt = next((name for magic, name in _MAGIC if data.startswith(magic)), None)
        if fmt is None:
            raise InvalidArgument(f"image bytes must be PNG or JPEG, got bytes starting {data[:8]!r}")
        image = _pil()
        try:
            with image.open(io.BytesIO(data)) as header:  # lazy: reads the header, decodes nothing
                width, height = header.size
        except image.DecompressionBombError as exc:
            raise InvalidArgument(f"a {fmt} image of {len(data):,} bytes that would decode to {exc}") from None
        except Exception as exc:
            raise InvalidArgument(f"unreadable {fmt} image ({len(data):,} bytes): {exc}") from None
        _check_size(width, height, limits)
        return cls(width, height, encoded=bytes(data), fmt=fmt)

    @classmethod
    def from_data_url(cls, url: str, limits: ImageLimits | None = None) -> EnvImage:
        """A ``data:image/png;base64,...`` (or jpeg) URL."""
        head, comma, payload = url.partition(",")
        if not (comma and head.startswith("data:image/") and head.endswith(";base64")):
            raise InvalidArgument(f"an image URL must be data:image/<png|jpeg>;base64,..., got {url[:40]!r}")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidArgument(f"the image data URL is not valid base64: {exc}") from None
        return cls.from_bytes(data, limits)

    @classmethod
    def from_pil(cls, image: Any, limits: ImageLimits | None = None) -> EnvImage:
        """A PIL image: its size read now, its pixels (as RGB: what processors take) when first asked."""
        width, height = image.size
        _check_size(width, height, limits)
        return cls(width, height, source=image)

    @classmethod
    def from_array(cls, array: Any, limits: ImageLimits | None = None) -> EnvImage:
        """An HxWxC (C in 1, 3, 4) or HxW uint8 array, or nested lists of that shape. Shape,
        dtype and size are checked on the array as given (a broadcast view stays a view)."""
        with MissingExtra.translate("an image observation given as pixels"):
            import numpy as np

        if isinstance(array, list):  # the shape first: a list's array is made only once it passes
            shape = _list_shape(array)
            _check_shape(shape)
            _check_size(shape[1], shape[0], limits)
        try:
            values = np.asarray(array)  # an ndarray as it is: no copy
        except ValueError as exc:  # ragged lists
            raise InvalidArgument(f"image pixels must be a rectangular HxWxC array: {exc}") from None
        _check_shape(values.shape)
        _check_size(values.shape[1], values.shape[0], limits)
        if values.dtype != np.uint8:
            if values.dtype.kind not in "iu" or values.size and (values.min() < 0 or values.max() > 255):
                raise InvalidArgument(f"image pixels must be uint8 (0-255), got dtype {values.dtype}")
        return cls(values.shape[1], values.shape[0], source=values)

    def encoded(self) -> tuple[bytes, str]:
        """``(bytes, mime)``: the bytes given, or the pixels as PNG (lossless)."""
        if self._encoded is None:
            self._encoded, self._format = self._png(), "PNG"
            self._pixels_png = self._encoded
        return self._encoded, _MIME[self._format or "PNG"]

    def data_url(self) -> str:
        """The image as a base64 data URL: how it travels inside an observation payload."""
        data, mime = self.encoded()
        return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"

    def pixels_data_url(self) -> str:
        """The RGB pixels ``pil()`` gives, as a PNG data URL: what an engine that decodes images
        itself is sent, to see exactly the pixels the trainer's processor saw (given bytes may be
        JPEG, which another decoder may round differently, or hold alpha, which it may flatten
        onto a background instead of dropping)."""
        if self._pixels_png is None:
            self._pixels_png = self._png()
        return f"data:image/png;base64,{base64.b64encode(self._pixels_png).decode('ascii')}"

    def _png(self) -> bytes:
        buffer = io.BytesIO()
        self.pil().save(buffer, format="PNG")
        return buffer.getvalue()

    def pil(self) -> Any:
        """The RGB pixels as a PIL image (decoded or copied once: check a bound first). Do not
        mutate it."""
        if self._pil is None:
            source, self._source = self._source, None
            if source is None:
                with _pil().open(io.BytesIO(self._encoded or b"")) as opened:
                    self._pil = opened.convert("RGB")
            elif hasattr(source, "ndim"):
                self._pil = _array_to_pil(source)
            else:
                self._pil = source.convert("RGB") if source.mode != "RGB" else source.copy()
        return self._pil

    def checksum(self) -> str:
        """sha256 of the size and RGB pixels: equal wherever the same picture was decoded."""
        if self._digest is None:
            pixels = self.pil()
            digest = hashlib.sha256(f"{pixels.width}x{pixels.height}:".encode())
            digest.update(pixels.tobytes())
            self._digest = digest.hexdigest()
        return self._digest

    def save(self, path: Any) -> None:
        """Write the image (its own bytes, or the pixels as PNG)."""
        data, _ = self.encoded()
        with open(path, "wb") as file:
            file.write(data)

    @property
    def extension(self) -> str:
        return "jpg" if self.encoded()[1] == "image/jpeg" else "png"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EnvImage):
            return NotImplemented
        if self.size != other.size:
            return False
        if self._encoded is not None and self._encoded == other._encoded:
            return True  # the same bytes: the same pixels, without decoding either
        return self.checksum() == other.checksum()

    def __hash__(self) -> int:
        return hash(self.checksum())

    def __repr__(self) -> str:
        return f"[image {self.width}x{self.height}]"


def _check_size(width: int, height: int, limits: ImageLimits | None) -> None:
    problem = limits.size_problem(width, height) if limits is not None else None
    if problem is not None:
        raise InvalidArgument(problem)


def _check_shape(shape: tuple[int, ...]) -> None:
    if not (len(shape) == 2 or (len(shape) == 3 and shape[2] in (1, 3, 4))) or 0 in shape:
        raise InvalidArgument(f"image pixels must be HxWxC (C = 1, 3 or 4) or HxW, got shape {tuple(shape)}")


def _list_shape(value: list[Any]) -> tuple[int, ...]:
    """The shape nested lists claim, read along their first items (numpy checks the rest)."""
    shape: list[int] = []
    while isinstance(value, list) and len(shape) < 4:
        shape.append(len(value))
        value = value[0] if value else None
    return tuple(shape)


def _array_to_pil(values: Any) -> Any:
    """A checked array's pixels as an RGB PIL image: the one copy, made when they are needed."""
    import numpy as np

    if values.ndim == 3 and values.shape[2] == 1:
        values = values[:, :, 0]
    image = _pil().fromarray(np.ascontiguousarray(values, dtype=np.uint8))
    return image.convert("RGB") if image.mode != "RGB" else image


@dataclass(frozen=True)
class ImageObservation:
    """An observation with pictures: the text and its images (shown before the text)."""

    text: str
    images: tuple[EnvImage, ...]

    def transcript(self) -> str:
        """The observation as a plain transcript shows it: ``[image WxH]`` per image, then the text."""
        return "\n".join([*(repr(image) for image in self.images), self.text])

    def payload(self) -> dict[str, Any]:
        """The observation as it travels: ``{"text": ..., "images": [data URL, ...]}`` (check
        the images' size first: this encodes them)."""
        return {"text": self.text, "images": [image.data_url() for image in self.images]}

    def __len__(self) -> int:  # characters of text: what a context check measures before tokenizing
        return len(self.text)


Observation = "str | ImageObservation"
"""What ``reset``/``step`` return as the observation once read by the protocol's rules."""


def image_from_value(value: Any, limits: ImageLimits | None = None) -> EnvImage:
    """One image in any of the protocol's forms (an ``EnvImage`` passes through), its size
    checked against ``limits`` (when given) before anything is copied or decoded."""
    if isinstance(value, EnvImage):
        _check_size(value.width, value.height, limits)
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return EnvImage.from_bytes(value if isinstance(value, bytes) else bytes(value), limits)
    if isinstance(value, str):
        return EnvImage.from_data_url(value, limits)
    module = type(value).__module__ or ""
    if module.startswith("PIL."):
        return EnvImage.from_pil(value, limits)
    if module.startswith("numpy") or isinstance(value, list):
        return EnvImage.from_array(value, limits)
    raise InvalidArgument(
        f"an image must be a PIL.Image, an HxWxC uint8 numpy array, PNG/JPEG bytes or a data URL, "
        f"got {type(value).__name__}"
    )


def observation_from(value: Any, where: str, limits: ImageLimits | None = None) -> str | ImageObservation:
    """The protocol's observation: a ``str``, or a mapping with ``text`` and ``image``/``images``
    (an ``ImageObservation`` passes through). A mapping without images is its text.
    ``EnvProtocolError`` naming ``where`` (``"Env.step()"``) and what is wrong otherwise,
    an image over ``limits`` included (checked before it is copied or decoded)."""
    if isinstance(value, str):
        return value
    if isinstance(value, ImageObservation):
        if limits is not None:
            for image in value.images:
                limits.check_image(image, where)
        return value
    if not isinstance(value, Mapping):
        raise EnvProtocolError(
            f"{where} observation must be str, got {type(value).__name__}"  # or a mapping: docs/vision.md
        )
    unknown = set(value) - {"text", "image", "images"}
    if unknown or ("image" in value and "images" in value):
        why = f"unknown keys {sorted(map(str, unknown))}" if unknown else "both 'image' and 'images'"
        raise EnvProtocolError(f"{where} observation mapping has {why}: it takes 'text' and 'image' or 'images'")
    text = value.get("text", "")
    if not isinstance(text, str):
        raise EnvProtocolError(f"{where} observation['text'] must be str, got {type(text).__name__}")
    if "image" in value:
        raw: Sequence[Any] = [] if value["image"] is None else [value["image"]]
    else:
        raw = value.get("images") or []
        if not isinstance(raw, (list, tuple)):
            raise EnvProtocolError(f"{where} observation['images'] must be a list, got {type(raw).__name__}")
    images = []
    for index, item in enumerate(raw):
        try:
            images.append(image_from_value(item, limits))
        except InvalidArgument as exc:
            raise EnvProtocolError(f"{where} observation image {index}: {exc}") from None
    return ImageObservation(text, tuple(images)) if images else text


def observation_problem(value: Any, where: str) -> str | None:
    """Why ``value`` is not an observation (for a report listing every problem); None when it is."""
    try:
        observation_from(value, where)
    except EnvProtocolError as exc:
        return str(exc)
    return None


def observation_text(observation: str | ImageObservation) -> str:
    """The text of an observation (without its images)."""
    return observation if isinstance(observation, str) else observation.text


def observation_images(observation: str | ImageObservation) -> tuple[EnvImage, ...]:
    """The images of an observation (none for text)."""
    return () if isinstance(observation, str) else observation.images
