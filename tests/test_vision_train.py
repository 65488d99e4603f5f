"""Training vision-language models on image envs: GRPO, PPO and REINFORCE pass the pixels through
the log-prob recompute (the vision tower gets gradients), LoRA trains, a real VLM folder loads
through AutoProcessor, and training over ``env_url`` sees the pixels in-process training sees."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from agilerl.builtins.colors import ColorsEnv
from agilerl.rollout.collector import RolloutCollector
from agilerl.generation.policy import SamplingParams, ScriptedPolicy, TransformersPolicy
from agilerl.train.batch import collate_trajectories
from agilerl.train.logprobs import policy_logprobs
from tests.health import start_server

pytestmark = pytest.mark.slow


def _vision_grad(model: Any) -> float:
    inner = getattr(model, "model", model)
    tower = getattr(inner, "visual", None) or getattr(getattr(inner, "model", inner), "visual", None)
    return sum(float(p.grad.abs().sum()) for p in tower.parameters() if p.grad is not None)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("algorithm", ["grpo", "llmppo", "llmreinforce"])
def test_each_algorithm_trains_the_vision_tower_through_the_recompute(algorithm: str, tmp_path: Path) -> None:
    from agilerl.train.algorithm import build_algorithm
    from agilerl.train.tiny_model import tiny_vlm_and_tokenizer

    model, tokenizer = tiny_vlm_and_tokenizer()
    with RolloutCollector(lambda: ColorsEnv(noise=8, format_reward=0.2), tokenizer, batch_size=2, group_size=4,
                          seed=0, sampling=SamplingParams(max_new_tokens=2)) as collector:
        batch = collector.collect(TransformersPolicy(model, tokenizer))
    rewards = {t.total_reward for t in batch.trajectories}
    if len(rewards) < 2:  # every rollout scored alike: give the batch a signal to learn from
        batch.trajectories[0].rewards[-1] = 1.0
    algo = build_algorithm({"name": algorithm})
    if algorithm == "llmppo":
        from agilerl.builtins.algorithms.ppo import ValueHeadModel

        policy = ValueHeadModel(model)
    else:
        policy = model
    tensors = collate_trajectories(batch.trajectories, tokenizer.pad_token_id)
    assert tensors.media is not None
    loss, _ = algo.loss(policy, tensors)
    loss.backward()
    assert _vision_grad(model) > 0  # the pixels reached the loss: the tower is trained


@pytest.mark.timeout(900)
def test_lora_on_the_tiny_vlm_trains_only_its_adapters() -> None:
    from agilerl.assembly.models import load_model_and_tokenizer
    from agilerl.manifest.settings import LoraSettings, ModelSettings
    from agilerl.train.algorithm import build_algorithm

    model, tokenizer = load_model_and_tokenizer(ModelSettings(name_or_path="tiny-vlm", lora=LoraSettings(r=4)))
    with RolloutCollector(lambda: ColorsEnv(format_reward=0.2), tokenizer, batch_size=1, group_size=4, seed=0,
                          sampling=SamplingParams(max_new_tokens=2)) as collector:
        batch = collector.collect(TransformersPolicy(model, tokenizer))
    batch.trajectories[0].rewards[-1] = 1.0  # a signal, whatever the untrained model said
    tensors = collate_trajectories(batch.trajectories, tokenizer.pad_token_id)
    loss, _ = build_algorithm({"name": "grpo"}).loss(model, tensors)
    loss.backward()
    trained = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert trained and all("lora_" in n for n in trained)
    assert any("visual" in n for n in trained)  # adapters on the vision tower's linears too (all-linear)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("family", ["llava", "idefics3"])
def test_a_real_vlm_folder_loads_through_autoprocessor_and_scores_its_own_samples(family: str, tmp_path: Path) -> None:
    from agilerl.assembly.models import load_model_and_tokenizer
    from agilerl.manifest.settings import ModelSettings
    from tests.vision_models import FAMILIES, tiny_model

    processor = FAMILIES[family]()
    built = tiny_model(family, processor)
    built.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    model, tokenizer = load_model_and_tokenizer(ModelSettings(name_or_path=str(tmp_path)))
    assert type(model) is type(built)
    with RolloutCollector(lambda: ColorsEnv(max_turns=2), tokenizer, batch_size=1, group_size=2, seed=0,
                          sampling=SamplingParams(max_new_tokens=3)) as collector:
        batch = collector.collect(TransformersPolicy(model, tokenizer))
    tensors = collate_trajectories(batch.trajectories, tokenizer.pad_token_id)
    with torch.no_grad():
        scores = policy_logprobs(model, tensors.input_ids, tensors.attention_mask, mask=tensors.action_mask, media=tensors.media)
    assert torch.allclose(scores[tensors.action_mask], tensors.old_logprobs[tensors.action_mask], atol=1e-4)


@pytest.mark.timeout(900)
def test_training_over_env_url_sees_the_pixels_in_process_training_sees(tmp_path: Path) -> None:
    from agilerl.train.loops import train_llm_rollout
    from agilerl.train.tiny_model import tiny_vlm_and_tokenizer

    model, tokenizer = tiny_vlm_and_tokenizer()
    config = '{"noise": 40, "num_colors": 4, "max_turns": 2}'
    url_file = tmp_path / "serve.url"
    server, url = start_server(
        [sys.executable, "-m", "agilerl", "serve", "colors", "--env-config", config, "--port", "0", "--port-file", str(url_file)],
        url_file, tmp_path / "serve.log",
    )
    try:
        policy = ScriptedPolicy(tokenizer, "7")
        runs = {}
        from agilerl.remote.client import RemoteEnvClient

        sources = {"local": lambda: ColorsEnv(noise=40, num_colors=4, max_turns=2), "served": lambda: RemoteEnvClient(url)}
        for name, env in sources.items():
            with RolloutCollector(env, tokenizer, batch_size=2, group_size=2, seed=3,
                                  sampling=SamplingParams(max_new_tokens=2)) as collector:
                runs[name] = collector.collect(policy).trajectories
        for local, served in zip(runs["local"], runs["served"]):
            assert served.token_ids == local.token_ids
            assert served.media.checksums() == local.media.checksums() and len(local.media.images) == 1
            for key, value in local.media.tensors().items():
                assert torch.equal(served.media.tensors()[key], value), key
        with RolloutCollector(sources["served"], tokenizer, batch_size=2, group_size=2, seed=3,
                              sampling=SamplingParams(max_new_tokens=2)) as collector:
            result = train_llm_rollout(model, tokenizer, collector, "grpo",
                                       {"max_steps": 1, "output_dir": str(tmp_path / "run"), "evaluation_interval": 0},
                                       show_progress=False)
        assert result.metrics["train/loss"] == result.metrics["train/loss"]  # a finite step was taken
    finally:
        server.terminate()
        server.wait(30)


COLORS_DDP = """
environment:
  env_type: rollout
  entrypoint: colors
  env_config: {noise: 8, format_reward: 0.2}
  max_turns: 2
model:
  name_or_path: tiny-vlm
algorithm:
  name: grpo
training:
  batch_size: 2
  group_size: 2
  max_steps: 2
  max_new_tokens: 2
  evaluation_interval: 2
  eval_episodes: 2
  checkpoint_interval: 2
"""


@pytest.mark.timeout(900)
def test_grpo_on_an_image_env_under_ddp(tmp_path: Path) -> None:
    """Two ranks (gloo, CPU) train tiny-vlm on colors: each rank's images go through its own
    recompute, DDP averages the gradients, the checkpoint holds the VLM."""
    from tests.test_train_distributed import _launch, _rows

    manifest = tmp_path / "colors.yaml"
    manifest.write_text(COLORS_DDP)
    _launch("ddp", manifest, tmp_path / "run")
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[0]["engine"].startswith("accelerate DDP, 2 processes")
    assert all(r["train/loss"] == r["train/loss"] for r in rows[1:])
    assert (tmp_path / "run" / "checkpoints" / "step-000002" / "model.safetensors").is_file()


def test_a_tiny_vlm_checkpoint_resumes_with_its_processor_built_from_code(tmp_path: Path) -> None:
    from agilerl.assembly.models import load_model_and_tokenizer
    from agilerl.manifest.settings import ModelSettings
    from agilerl.generation.media import processor_of

    model, tokenizer = load_model_and_tokenizer(ModelSettings(name_or_path="tiny-vlm"), seed=1)
    model.save_pretrained(tmp_path)
    processor_of(tokenizer).save_pretrained(tmp_path)
    resumed, again = load_model_and_tokenizer(ModelSettings(name_or_path="tiny-vlm"), checkpoint=tmp_path)
    assert processor_of(again) is not None
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), resumed.state_dict().values()))


@pytest.mark.timeout(900)
def test_async_training_on_an_image_env(tmp_path: Path) -> None:
    """rollout_mode async: groups played by the inference copy (the images with them) are trained
    a step later; the importance weights stay near 1 (the sampler's log-probs are the trainer's)."""
    from agilerl.train.loops import train_llm_rollout
    from agilerl.train.metrics import read_metrics
    from agilerl.train.tiny_model import tiny_vlm_and_tokenizer

    model, tokenizer = tiny_vlm_and_tokenizer()
    with RolloutCollector(lambda: ColorsEnv(max_turns=2, format_reward=0.2), tokenizer, batch_size=2, group_size=4,
                          seed=0, sampling=SamplingParams(max_new_tokens=2)) as collector:
        train_llm_rollout(model, tokenizer, collector, "grpo",
                          {"max_steps": 3, "output_dir": str(tmp_path), "rollout_mode": "async", "max_staleness": 1,
                           "evaluation_interval": 0}, show_progress=False)
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "train/loss" in r]
    assert len(rows) == 3 and max(r["rollout/staleness_max"] for r in rows) == 1
    assert all(abs(r["algo/importance_weight_mean"] - 1) < 0.05 for r in rows)
