"""Image observations: the protocol's shapes, the wire (bit for bit, through our server and client),
and OpenEnv's image fields (BrowserGym's nested screenshot, Atari's flat screen), in process and served."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import urllib.request
from typing import Any

import numpy as np
import pytest
from PIL import Image

from agilerl.envs.client import InProcessEnvClient
from agilerl.envs.observations import make_observation_reader
from agilerl.errors import EnvProtocolError, ObservationError
from agilerl.images import EnvImage, ImageLimits, ImageObservation, observation_from
from agilerl.remote.client import RemoteEnvClient
from agilerl.remote.hosting import resolve_env

RNG = np.random.default_rng(0)
PIXELS = RNG.integers(0, 256, (24, 40, 3), dtype=np.uint8)


def _encoded(fmt: str, pixels: np.ndarray = PIXELS) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


PNG, JPEG = _encoded("PNG"), _encoded("JPEG")
DATA_URL = "data:image/jpeg;base64," + base64.b64encode(JPEG).decode()


def _pixels_sha(image: EnvImage) -> str:
    return hashlib.sha256(np.asarray(image.pil()).tobytes()).hexdigest()


@pytest.mark.parametrize(
    "value",
    [Image.fromarray(PIXELS), PIXELS, PIXELS[:, :, :1], np.dstack([PIXELS, PIXELS[:, :, :1]]), PNG, JPEG, DATA_URL],
    ids=["pil", "array", "gray-hwc1", "rgba", "png", "jpeg", "data-url"],
)
def test_every_image_form_becomes_one_rgb_image_of_its_size(value: Any) -> None:
    observation = observation_from({"text": "look", "image": value}, "E.reset()")
    assert isinstance(observation, ImageObservation) and observation.text == "look"
    (image,) = observation.images
    assert image.size == (40, 24) and image.pil().mode == "RGB"
    assert repr(image) == "[image 40x24]"


def test_encoded_images_keep_their_bytes_and_pixels_become_lossless_png() -> None:
    assert EnvImage.from_bytes(JPEG).encoded() == (JPEG, "image/jpeg")
    from_pixels = EnvImage.from_array(PIXELS)
    data, mime = from_pixels.encoded()
    assert mime == "image/png" and np.array_equal(np.asarray(Image.open(io.BytesIO(data))), PIXELS)


def test_an_engine_is_sent_the_decoded_pixels_as_png_whatever_the_env_gave() -> None:
    """What vLLM decodes must be the pixels the trainer's processor saw: JPEG bytes (which another
    decoder may round otherwise) and RGBA PNG (whose alpha another may flatten onto a background)
    go as the RGB pixels ``pil()`` gives, losslessly."""
    rgba = np.zeros((6, 9, 4), dtype=np.uint8)
    rgba[..., 0], rgba[..., 3] = 200, np.arange(9, dtype=np.uint8) * 30  # red, fading out
    buffer = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buffer, format="PNG")
    for image in (EnvImage.from_bytes(JPEG), EnvImage.from_bytes(buffer.getvalue()), EnvImage.from_array(PIXELS)):
        url = image.pixels_data_url()
        assert url.startswith("data:image/png;base64,")  # never the JPEG bytes
        with Image.open(io.BytesIO(base64.b64decode(url.partition(",")[2]))) as decoded:
            assert decoded.mode == "RGB"  # no alpha left for another decoder to flatten
        sent = EnvImage.from_data_url(url)
        assert np.array_equal(np.asarray(sent.pil()), np.asarray(image.pil())) and sent.checksum() == image.checksum()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (7, "E.step() observation must be str, got int"),
        ({"text": "x", "image": "http://x/y.png"}, "image 0: an image URL must be data:image/"),
        ({"text": "x", "images": [b"GIF89a..."]}, "image bytes must be PNG or JPEG"),
        ({"text": "x", "image": np.zeros((4, 4, 2), np.uint8)}, "HxWxC (C = 1, 3 or 4)"),
        ({"text": "x", "image": np.full((4, 4), 300)}, "must be uint8"),
        ({"text": "x", "image": 1, "images": []}, "both 'image' and 'images'"),
        ({"text": "x", "picture": PNG}, "unknown keys ['picture']"),
        ({"text": 3, "image": PNG}, "observation['text'] must be str"),
    ],
)
def test_a_malformed_observation_is_refused_naming_the_env_and_what_is_wrong(value: Any, problem: str) -> None:
    with pytest.raises(EnvProtocolError, match=None) as caught:
        observation_from(value, "E.step()")
    assert problem in str(caught.value)


def test_a_mapping_without_images_is_its_text() -> None:
    assert observation_from({"text": "hi", "images": []}, "E.step()") == "hi"


def test_both_size_limits_name_the_env_the_size_and_the_setting() -> None:
    limits = ImageLimits(max_pixels=100, max_images=2)
    with pytest.raises(EnvProtocolError, match=r"E\.step\(\): an image of 40x24 = 960 pixels is over max_image_pixels=100.*model\.max_image_pixels"):
        limits.check_image(EnvImage.from_array(PIXELS), "E.step()")
    with pytest.raises(EnvProtocolError, match=r"E\.step\(\): the conversation would hold 3 images, over max_images=2.*model\.max_images"):
        limits.check_count(3, "E.step()")


class PictureEnv:
    """Shows the same pictures in every form the protocol takes."""

    max_turns = 3

    def reset(self, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        return {"text": "look", "images": [PIXELS, JPEG, Image.fromarray(PIXELS), DATA_URL]}, {}

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return {"text": f"again {action}", "image": PNG}, 1.0, False, False, {}


def test_images_cross_our_server_bit_for_bit_over_ws_and_http() -> None:
    local_prompt, _ = InProcessEnvClient(PictureEnv()).reset(seed=0)
    url, server = resolve_env(PictureEnv)
    with server, RemoteEnvClient(url) as client:
        prompt, _ = client.reset(seed=0)
        observation = client.step("x")[0]
        request = urllib.request.Request(url + "/reset", data=b"{}", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            http_images = json.load(response)["observation"]["images"]
    assert isinstance(prompt, ImageObservation) and prompt.text == "look"
    assert [_pixels_sha(i) for i in prompt.images] == [_pixels_sha(i) for i in local_prompt.images]
    assert [i.checksum() for i in prompt.images] == [i.checksum() for i in local_prompt.images]
    assert prompt.images[1].encoded() == (JPEG, "image/jpeg")  # encoded bytes travel as they were given
    assert observation.text == "again x" and observation.images[0].encoded() == (PNG, "image/png")
    assert [EnvImage.from_data_url(u).checksum() for u in http_images] == [i.checksum() for i in prompt.images]


def test_an_image_too_big_for_the_clients_frame_cap_is_refused_with_the_setting_to_raise() -> None:
    big = RNG.integers(0, 256, (700, 700, 3), dtype=np.uint8)  # ~1.5 MB as PNG, ~2 MB in base64

    class BigEnv(PictureEnv):
        def reset(self, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
            return {"text": "big", "image": big}, {}

    url, server = resolve_env(BigEnv)
    with server:
        with RemoteEnvClient(url, max_message_bytes=1_000_000, retry_budget_s=0.5) as client, pytest.raises(Exception) as caught:
            client.reset(seed=0)
        assert "max_message_bytes" in str(caught.value)
        with RemoteEnvClient(url) as client:  # the default cap carries it
            assert client.reset(seed=0)[0].images[0].checksum() == EnvImage.from_array(big).checksum()


# -- OpenEnv's image fields ---------------------------------------------------------------------

SCREENSHOT = PIXELS.tolist()  # BrowserGym: [height][width][channels]
ATARI = {"screen": PIXELS.reshape(-1).tolist(), "screen_shape": [24, 40, 3], "legal_actions": [0, 1], "lives": 3}


def test_browsergym_screenshot_and_atari_screen_become_images_and_leave_the_text() -> None:
    browser = make_observation_reader(image_field="screenshot")(
        {"text": "page", "url": "http://x", "screenshot": SCREENSHOT, "goal": "click"}
    )
    assert browser.text == "page" and _pixels_sha(browser.images[0]) == _pixels_sha(EnvImage.from_array(PIXELS))
    atari = make_observation_reader(image_field="screen")(dict(ATARI))
    assert atari.images[0].size == (40, 24)
    assert "screen" not in atari.text and "lives: 3" in atari.text  # the rest is still shown
    assert make_observation_reader(image_field="screenshot")({"text": "no shot", "screenshot": None}) == "no shot"


def test_an_image_field_that_is_missing_or_unreadable_names_the_setting() -> None:
    with pytest.raises(ObservationError, match="image_field 'shot': no 'shot' in the observation"):
        make_observation_reader(image_field="shot")({"text": "x"})
    with pytest.raises(ObservationError, match="flat list of pixels needs its shape"):
        make_observation_reader(image_field="screen")({"screen": [1, 2, 3]})


def test_an_observation_processor_may_return_text_and_images() -> None:
    read = make_observation_reader(observation_processor=lambda o: {"text": o["goal"], "image": o["png"]})
    observation = read({"goal": "find it", "png": base64.b64encode(PNG).decode() and PNG})
    assert observation.text == "find it" and observation.images[0].encoded()[0] == PNG
