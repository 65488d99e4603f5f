"""``agilerl env check`` on an image env: ``[image WxH]`` in the plain transcript, the images written
out with ``--save-images``, and the VLM's placeholders with ``--tokenizer tiny-vlm``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from agilerl.builtins.colors import COLORS


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agilerl", "env", "check", "colors", *args],
        capture_output=True, text=True, timeout=600,
    )


def test_the_plain_transcript_shows_each_image_and_save_images_writes_them(tmp_path: Path) -> None:
    result = _check("--episodes", "2", "--actions", "1", "--env-config", '{"size": 20}', "--save-images", str(tmp_path))
    assert result.returncode in (0, 1), result.stderr
    assert "env ColorsEnv: ok" in result.stdout
    assert result.stdout.count("[user] [image 20x20]\nWhich colour is this square?") == 2
    saved = sorted(p.name for p in tmp_path.iterdir())
    assert saved == ["episode0_image0.png", "episode1_image0.png"]
    pixel = Image.open(tmp_path / "episode0_image0.png").getpixel((0, 0))
    assert pixel in [rgb for _, rgb in COLORS]  # the square itself, lossless


@pytest.mark.slow  # builds tiny-vlm in a subprocess
def test_with_the_tiny_vlm_tokenizer_the_transcript_holds_its_placeholders() -> None:
    result = _check("--tokenizer", "tiny-vlm", "--actions", "2")
    assert result.returncode in (0, 1), result.stderr
    assert "<|vision_start|>" + "<|image_pad|>" * 4 + "<|vision_end|>Which colour" in result.stdout
