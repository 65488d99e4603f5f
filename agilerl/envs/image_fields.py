"""Images inside an observation payload (remote, or an in-process OpenEnv env's): where they are,
and how each field's shape becomes an ``EnvImage``.

Our server sends ``{"text": ..., "images": [data URL, ...]}``: read without configuration.
OpenEnv envs name their own field: ``image_field`` (a dotted path, as ``observation_field``)
points at it. A field may hold nested lists of pixels (BrowserGym's ``screenshot``, HxWxC), a flat
list with a ``<field>_shape`` sibling (Atari's ``screen`` and ``screen_shape``), base64 PNG/JPEG
(with or without the ``data:`` prefix), or a list of any of these.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from agilerl.errors import InvalidArgument, ObservationError
from agilerl.images import EnvImage, image_from_value

__all__ = ["WIRE_IMAGES", "images_at", "without_field", "with_images_reader"]

WIRE_IMAGES = "images"
"""The payload key our server puts an observation's images under (data URLs)."""


def _at(observation: dict[str, Any], path: str) -> tuple[dict[str, Any] | list[Any], str | int, Any]:
    """``(container, key, value)`` at a dotted path; ``ObservationError`` naming the fields."""
    container: Any = observation
    parts = path.split(".")
    for depth, part in enumerate(parts):
        if isinstance(container, dict) and part in container:
            key: str | int = part
        elif isinstance(container, list) and part.lstrip("-").isdigit() and -len(container) <= int(part) < len(container):
            key = int(part)
        else:
            raise ObservationError(
                f"image_field {path!r}: no {part!r} in the observation (its fields: "
                f"{', '.join(map(str, observation)) or 'none'}). Fix image_field, or use an observation_processor."
            )
        if depth == len(parts) - 1:
            return container, key, container[key]
        container = container[key]
    raise AssertionError("unreachable")


def _one_image(value: Any, shape: Any) -> EnvImage:
    if isinstance(value, str) and not value.startswith("data:"):
        try:
            return EnvImage.from_bytes(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            raise InvalidArgument(f"a string image must be base64 PNG/JPEG or a data URL, got {value[:40]!r}") from None
    if isinstance(value, list) and value and not isinstance(value[0], list):  # flat pixels: needs a shape
        if not (isinstance(shape, list) and len(shape) in (2, 3)):
            raise InvalidArgument(
                "a flat list of pixels needs its shape beside it (a '<field>_shape' of [H, W] or [H, W, C])"
            )
        import numpy as np

        if not all(isinstance(n, int) and n > 0 for n in shape) or int(np.prod(shape)) != len(value):
            raise InvalidArgument(f"the pixels' shape {shape} does not hold the {len(value):,} values given")
        return EnvImage.from_array(np.asarray(value).reshape(shape))
    return image_from_value(value)


def images_at(observation: dict[str, Any], path: str) -> tuple[EnvImage, ...]:
    """The images at ``path`` (none when the field is None or empty)."""
    container, key, value = _at(observation, path)
    shape = container.get(f"{key}_shape") if isinstance(container, dict) else None
    if value is None or (isinstance(value, (list, str)) and not value):
        return ()
    many = isinstance(value, list) and value and (
        isinstance(value[0], str) or (isinstance(value[0], list) and value[0] and isinstance(value[0][0], list)
                                      and value[0][0] and isinstance(value[0][0][0], list))
    )
    try:
        return tuple(_one_image(v, None) for v in value) if many else (_one_image(value, shape),)
    except InvalidArgument as exc:
        raise ObservationError(f"image_field {path!r}: {exc}") from None


def without_field(observation: dict[str, Any], path: str) -> dict[str, Any]:
    """The observation without the image field (and its ``_shape``), so its text never shows pixels."""
    head, _, last = path.rpartition(".")
    if not head:
        return {k: v for k, v in observation.items() if k not in (last, f"{last}_shape")}
    copy = dict(observation)
    parent: Any = copy
    for part in head.split("."):
        if not isinstance(parent, dict) or not isinstance(parent.get(part), dict):
            return copy
        parent[part] = dict(parent[part])
        parent = parent[part]
    parent.pop(last, None)
    parent.pop(f"{last}_shape", None)
    return copy


def with_images_reader(text_reader: Any, image_field: str | None) -> Any:
    """``text_reader`` extended to images: from ``image_field`` when set (the field is kept out
    of the text), else from our server's ``images`` key. A text payload costs one key lookup."""
    from agilerl.images import ImageObservation, observation_text

    if image_field:
        path = image_field

        def read_field(observation: dict[str, Any]) -> Any:
            images = images_at(observation, path)
            text = text_reader(without_field(observation, path))
            return ImageObservation(observation_text(text), images) if images else text

        return read_field

    def read(observation: dict[str, Any]) -> Any:
        if WIRE_IMAGES not in observation:
            return text_reader(observation)
        images = images_at(observation, WIRE_IMAGES)
        text = text_reader(observation)
        if images and not isinstance(text, str):  # a processor's own images come first
            return ImageObservation(text.text, (*images, *text.images))
        return ImageObservation(text, images) if images else text

    return read
