"""Image bounds are checked before the memory they guard is spent: a broadcast 10000x10000 array
(free to the env) and a 136 KB PNG bomb (12000x12000) are refused, in process, served and by
``env check``, while the process's peak memory stays where it was (measured in a child process,
whose ``ru_maxrss`` is its own)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest

from agilerl.errors import InvalidArgument
from agilerl.images import EnvImage, ImageLimits, observation_from

ROOT = Path(__file__).resolve().parent.parent
BIG = 10_000


def png_bomb(width: int, height: int) -> bytes:
    """A grey PNG of zeros, compressed row by row: a few hundred KB however large it claims to be."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    packer, row = zlib.compressobj(9), b"\0" * (width + 1)
    idat = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _peak_growth_mb(body: str, setup: str = "") -> dict:
    """Run ``body`` in a child (after ``setup()``, which imports what it needs) and return what
    it printed plus how far its peak resident memory grew during ``body`` (MB)."""
    script = "\n".join([
        "import json, resource, sys",
        f"sys.path.insert(0, {str(ROOT)!r})",
        "from tests.test_bounds_images import *",
        setup,
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss",
        "out = {}",
        textwrap.dedent(body),
        "out['growth_mb'] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024",
        "print(json.dumps(out))",
    ])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


_SETUP = (
    "from agilerl.remote.client import RemoteEnvClient; "
    "from agilerl.remote.hosting import resolve_env; from agilerl.rollout.harness import RolloutHarness; "
    "from agilerl.generation.media import attach_processor; from tests.vision_models import qwen2_vl_processor; "
    "tokenizer = attach_processor(qwen2_vl_processor()); import PIL.PngImagePlugin, PIL.JpegImagePlugin"
)


class BroadcastEnv:
    """Shows a 10000x10000 RGB picture that costs the env 3 bytes (a broadcast view)."""

    max_turns = 2

    def reset(self, seed: int | None = None) -> tuple[object, dict]:
        return {"text": "look", "image": np.broadcast_to(np.uint8(7), (BIG, BIG, 3))}, {}

    def step(self, action: str) -> tuple[object, float, bool, bool, dict]:
        return "ok", 0.0, True, False, {}


class BombEnv(BroadcastEnv):
    """Shows a 12000x12000 PNG of ~140 KB, the same one on every reset."""

    bomb = png_bomb(12_000, 12_000)

    def reset(self, seed: int | None = None) -> tuple[object, dict]:
        return {"text": "look", "image": self.bomb}, {}


def test_sizes_are_read_without_copying_and_a_bound_refuses_before_any_copy() -> None:
    broadcast = np.broadcast_to(np.uint8(7), (BIG, BIG, 3))
    image = EnvImage.from_array(broadcast)
    assert image.size == (BIG, BIG)  # read from the shape: nothing copied
    with pytest.raises(InvalidArgument, match=r"10000x10000 = 100,000,000 pixels is over max_image_pixels=4,194,304"):
        EnvImage.from_array(broadcast, ImageLimits())
    bomb = EnvImage.from_bytes(BombEnv.bomb)
    assert bomb.size == (12_000, 12_000) and len(BombEnv.bomb) < 200_000
    assert bomb == EnvImage.from_bytes(BombEnv.bomb)  # the same bytes: equal without decoding
    with pytest.raises(InvalidArgument, match=r"12000x12000 .* raise agilerl serve --max-image-pixels"):
        EnvImage.from_bytes(BombEnv.bomb, ImageLimits(setting="agilerl serve --max-image-pixels"))
    with pytest.raises(InvalidArgument, match=r"shape \(2, 3, 5\)"):
        EnvImage.from_array([[[0] * 5] * 3] * 2)  # a list's shape is read before its array is made
    with pytest.raises(Exception, match=r"E\.reset\(\) observation image 0: an image of 10000x10000"):
        observation_from({"text": "t", "image": broadcast}, "E.reset()", ImageLimits())


def test_a_huge_image_is_refused_in_process_and_served_without_the_memory() -> None:
    out = _peak_growth_mb(
        """
        for env in (BroadcastEnv, BombEnv):
            harness = RolloutHarness.local(env(), tokenizer)
            try:
                harness.reset(seed=0)
            except Exception as exc:
                out[f"{env.__name__} in process"] = f"{type(exc).__name__}: {exc}"
            url, server = resolve_env(env)
            with server, RemoteEnvClient(url, retry_budget_s=0.5) as client:
                try:
                    client.reset(seed=0)
                except Exception as exc:
                    out[f"{env.__name__} served"] = f"{type(exc).__name__}: {exc}"
        """,
        _SETUP,
    )
    for env in ("BroadcastEnv", "BombEnv"):
        in_process, served = out[f"{env} in process"], out[f"{env} served"]
        assert in_process.startswith("EnvProtocolError") and f"{env}.reset()" in in_process
        assert "over max_image_pixels=4,194,304" in in_process and "model.max_image_pixels" in in_process
        assert "over max_image_pixels=4,194,304" in served and "agilerl serve --max-image-pixels" in served
    assert out["growth_mb"] < 100, out  # one full RGB copy of either is 300 MB or more


def test_env_check_reports_a_bomb_without_decoding_it() -> None:
    out = _peak_growth_mb(
        """
        report = check_env(BombEnv(), raise_on_error=False)
        out["problems"], out["warnings"] = report.problems, report.warnings
        """,
        "from agilerl.envs.checker import check_env; import PIL.PngImagePlugin",
    )
    assert out["problems"] == []
    assert any("12000x12000 = 144,000,000 pixels is over max_image_pixels" in w for w in out["warnings"]), out
    assert out["growth_mb"] < 100, out  # decoding it to compare the two resets: 432 MB


def test_a_served_image_within_a_raised_bound_still_crosses() -> None:
    from agilerl.remote.client import RemoteEnvClient
    from agilerl.remote.hosting import resolve_env

    class WideEnv(BroadcastEnv):
        def reset(self, seed: int | None = None) -> tuple[object, dict]:
            return {"text": "wide", "image": np.full((8, 600, 3), 9, dtype=np.uint8)}, {}

    url, server = resolve_env(WideEnv, max_image_pixels=10_000)
    with server, RemoteEnvClient(url) as client:
        assert client.reset(seed=0)[0].images[0].size == (600, 8)
    url, server = resolve_env(WideEnv, max_image_pixels=4_000)
    with server, RemoteEnvClient(url, retry_budget_s=0.5) as client, pytest.raises(Exception, match="max_image_pixels=4,000"):
        client.reset(seed=0)


def test_images_for_a_chat_endpoint_are_checked_before_they_are_encoded() -> None:
    from agilerl.errors import EnvProtocolError
    from agilerl.images import ImageObservation
    from agilerl.rollout.vision import image_parts

    huge = ImageObservation("t", (EnvImage.from_array(np.broadcast_to(np.uint8(7), (BIG, BIG, 3))),))
    with pytest.raises(EnvProtocolError, match=r"an observation for the chat endpoint: an image of 10000x10000"):
        image_parts(huge)
    small = ImageObservation("t", (EnvImage.from_array(np.zeros((4, 6, 3), dtype=np.uint8)),))
    assert image_parts(small)[0]["image_url"]["url"].startswith("data:image/png;base64,")
