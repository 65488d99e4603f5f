"""``agilerl train`` and the training loops: every example runs, writes metrics, a plot and a
checkpoint that reloads; resume continues the step count; Ctrl-C saves; plugins' algorithms train."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agilerl.cli.main import main
from agilerl.errors import ManifestError
from agilerl.manifest.spec import load_manifest, parse_manifest
from agilerl.manifest.settings import ModelSettings
from agilerl.train.metrics import read_metrics
from agilerl.assembly.models import load_model_and_tokenizer
from tests.signals import as_from_a_terminal

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
GUESS = {"env_type": "rollout", "entrypoint": "guess", "env_config": {"target": 7}}


def _steps(output_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(output_dir / "metrics.jsonl")]


@pytest.mark.parametrize(
    ("example", "plot"),
    [("guess", "reward_curve.png"), ("countdown", "reward_curve.png"),
     ("sft", "loss_curve.png"), ("dpo", "loss_curve.png")],
)
def test_every_example_trains_and_its_checkpoint_reloads(example, plot, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "run"
    code = main(["train", str(EXAMPLES / example / "manifest.yaml"), "--max-steps", "2",
                 "--output-dir", str(out), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    assert _steps(out) == [0, 1, 2]  # the untrained baseline, then one line per step
    assert (out / plot).stat().st_size > 1000
    checkpoint = out / "checkpoints" / "step-000002"
    assert f"checkpoint: {checkpoint}" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    assert model.config.vocab_size == len(tokenizer) == 512


def test_resume_continues_the_step_count_and_the_log(tmp_path, capsys):
    import torch

    out = tmp_path / "run"
    args = ["train", str(EXAMPLES / "sft" / "manifest.yaml"), "--output-dir", str(out), "--no-progress"]
    assert main([*args, "--max-steps", "2"]) == 0
    saved = load_model_and_tokenizer(ModelSettings(), checkpoint=out / "checkpoints" / "step-000002")[0]
    (out / "metrics.jsonl").open("a").write('{"step": 3, "train/loss": 9.0}\n')  # past the checkpoint
    assert main([*args, "--max-steps", "4", "--resume"]) == 0
    assert "finished at step 4" in capsys.readouterr().out
    assert _steps(out) == [0, 1, 2, 3, 4]  # the stale step-3 line was dropped, not duplicated
    assert 9.0 not in [r.get("train/loss") for r in read_metrics(out / "metrics.jsonl")]
    resumed = load_model_and_tokenizer(ModelSettings(), checkpoint=out / "checkpoints" / "step-000004")[0]
    state = torch.load(out / "checkpoints" / "step-000004" / "accelerate" / "optimizer.bin", weights_only=True)
    assert all(s["step"] == 4 for s in state["state"].values())  # Adam's moments carried over
    assert any(not torch.equal(a, b) for a, b in zip(saved.parameters(), resumed.parameters()))


def test_ctrl_c_saves_a_checkpoint_and_exits_cleanly(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "agilerl", "train", str(EXAMPLES / "guess" / "manifest.yaml"),
           "--max-steps", "100000", "--output-dir", str(out), "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_from_a_terminal)
    try:
        deadline = time.monotonic() + 120
        while len(_steps(out)) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    step = _steps(out)[-1]
    assert f"stopped at step {step}" in stdout and "--resume" in stdout
    assert (out / "checkpoints" / f"step-{step:06d}" / "accelerate" / "optimizer.bin").is_file()


def test_lora_trains_only_the_adapters_and_resumes(tmp_path):
    from agilerl.assembly.from_manifest import train_from_manifest

    manifest = parse_manifest(
        {"environment": GUESS, "model": {"name_or_path": "tiny", "lora": {"r": 4}},
         "algorithm": {"name": "grpo", "beta": 0.1},  # the KL reference: the adapters switched off
         "training": {"batch_size": 2, "group_size": 4, "micro_batch_size": 4, "max_steps": 2,
                      "max_new_tokens": 2, "lr": 1e-2, "output_dir": str(tmp_path),
                      "evaluation_interval": 0}},
        base_dir=EXAMPLES / "guess",
    )
    result = train_from_manifest(manifest, show_progress=False)
    assert (result.checkpoint / "adapter_config.json").is_file()
    assert not (result.checkpoint / "model.safetensors").exists()
    model, _ = load_model_and_tokenizer(manifest.model, checkpoint=result.checkpoint)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    manifest.training.max_steps = 3
    assert train_from_manifest(manifest, resume="latest", show_progress=False).step == 3


def test_third_party_algorithm_plugin_trains_through_a_manifest(tmp_path):
    from agilerl.assembly.from_manifest import train_from_manifest
    from agilerl.registry import get_plugin_manager

    (tmp_path / "my_algo.py").write_text(textwrap.dedent(
        """
        from agilerl import hookimpl
        from agilerl.train.algorithm import Algorithm, AlgorithmConfig
        from agilerl.train.logprobs import masked_mean, policy_logprobs

        class ScaledConfig(AlgorithmConfig):
            scale: float = 1.0

        class ScaledReinforce(Algorithm[ScaledConfig]):
            config_class = ScaledConfig
            kind = "rollout"
            calls = 0

            def loss(self, policy, batch, reference=None):
                type(self).calls += 1
                logprobs = policy_logprobs(policy, batch.input_ids, batch.attention_mask)
                reward = batch.turn_rewards.sum(1, keepdim=True)
                loss = -self.config.scale * masked_mean(logprobs * reward, batch.loss_mask)
                return loss, {"scale_seen": self.config.scale}

        @hookimpl
        def register_algorithms(register):
            register("scaled-reinforce", ScaledReinforce, description="test plugin")
        """
    ))
    sys.path.insert(0, str(tmp_path))
    import my_algo

    pm = get_plugin_manager()
    pm.register(my_algo, name="my_algo")
    try:
        manifest = parse_manifest(
            {"environment": GUESS, "algorithm": {"name": "scaled-reinforce", "scale": 2.5},
             "training": {"batch_size": 2, "group_size": 2, "max_steps": 2, "max_new_tokens": 2,
                          "output_dir": str(tmp_path / "run"), "evaluation_interval": 0}},
            base_dir=EXAMPLES / "guess",
        )
        result = train_from_manifest(manifest, show_progress=False)
    finally:
        pm.unregister(my_algo)
        sys.path.remove(str(tmp_path))
    assert my_algo.ScaledReinforce.calls == 2
    assert result.metrics["algo/scale_seen"] == 2.5
    assert json.loads((result.checkpoint / "trainer_state.json").read_text())["algorithm"] == "ScaledReinforce"


def test_python_api_mismatches_are_named_before_any_step(chatml_tokenizer, tiny_model):
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.generation.policy import SamplingParams
    from agilerl.manifest.spec import parse_env_spec
    from agilerl.data.dataset_env import DatasetEnv
    from agilerl.train.loops import train_llm_dataset, train_llm_rollout
    from agilerl.errors import ConfigError, InvalidArgument

    hot = SamplingParams(temperature=0.7, max_new_tokens=2)
    with RolloutCollector.from_spec(
        parse_env_spec(GUESS), chatml_tokenizer, base_dir=EXAMPLES / "guess", batch_size=1, group_size=2, sampling=hot
    ) as collector:
        with pytest.raises(ConfigError, match=r"samples at temperature 0.7 but GRPO scores log-probs at 1.0; .*"
                           r"SamplingParams\(temperature=1.0"):
            train_llm_rollout(tiny_model, chatml_tokenizer, collector, "grpo", {"max_steps": 1}, show_progress=False)
        with pytest.raises(ConfigError, match=r"train_llm_rollout: algorithm SFT trains on dataset batches, not "
                           r"rollout; use SFT/DPO data .*train_llm_dataset"):
            train_llm_rollout(tiny_model, chatml_tokenizer, collector, "sft", {"max_steps": 1}, show_progress=False)
    sft = load_manifest(EXAMPLES / "sft" / "manifest.yaml")
    rows = DatasetEnv.from_spec(sft.environment, chatml_tokenizer, base_dir=sft.base_dir, batch_size=2)
    with pytest.raises(InvalidArgument, match=r"training.stop_at_eval_reward \(1.0\) needs an eval/reward: a dataset "
                       r"env's evaluation is the SFT loss on held-out rows; remove stop_at_eval_reward"):
        train_llm_dataset(tiny_model, chatml_tokenizer, rows, "sft", {"stop_at_eval_reward": 1.0}, show_progress=False)


@pytest.mark.parametrize(
    ("environment", "algorithm", "field"),
    [
        (GUESS, {"name": "sft"}, "environment.env_type: algorithm SFT trains on dataset batches"),
        (GUESS, {"name": "dpo"}, "environment.env_type: algorithm DPO trains on dataset batches"),
        ({"env_type": "dataset", "objective": "sft", "dataset": "d.jsonl"}, {"name": "grpo"},
         "environment.env_type: algorithm GRPO trains on rollout batches"),
        ({"env_type": "dataset", "objective": "sft", "dataset": "d.jsonl"}, {"name": "dpo"},
         "environment.objective: algorithm DPO trains on 'preference' batches"),
    ],
)
def test_an_incompatible_manifest_is_refused_before_any_model_loads(environment, algorithm, field, tmp_path):
    from agilerl.assembly.from_manifest import train_from_manifest

    manifest = parse_manifest(
        {"environment": environment, "algorithm": algorithm,
         "model": {"name_or_path": str(tmp_path / "no-such-model")}},  # loading it would fail
        base_dir=tmp_path,
    )
    with pytest.raises(ManifestError) as info:
        train_from_manifest(manifest, overrides={"output_dir": str(tmp_path / "run")}, show_progress=False)
    assert info.value.errors[0].startswith(field)
    assert not (tmp_path / "run").exists()


def test_sections_are_typed_and_misspelt_keys_are_errors():
    manifest = load_manifest(EXAMPLES / "guess" / "manifest.yaml")
    assert manifest.model.name_or_path == "tiny" and manifest.training.group_size == 8
    with pytest.raises(ManifestError, match=r"training\.learning_rate: Extra inputs"):
        parse_manifest({"environment": GUESS, "training": {"learning_rate": 1e-3}})
    with pytest.raises(ManifestError, match=r"training\.max_steps: Input should be greater"):
        parse_manifest({"environment": GUESS, "training": {"max_steps": 0}})
    with pytest.raises(ManifestError, match=r"training: .*stop_at_eval_reward=1.0 is checked at evaluations, "
                       r"and evaluation_interval is 0 \(never\); set evaluation_interval or remove stop_at_eval_reward"):
        parse_manifest({"environment": GUESS, "training": {"stop_at_eval_reward": 1.0, "evaluation_interval": 0}})
    with_options = parse_manifest({"environment": GUESS, "algorithm": {"name": "grpo", "beta": 0.1}})
    assert with_options.algorithm.as_mapping() == {"name": "grpo", "beta": 0.1}


def test_cli_errors_name_the_problem(tmp_path, capsys):
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        "environment:\n  env_type: rollout\n  entrypoint: guess\n"
        "algorithm:\n  name: grpo\n  epsilon: 0.3\n"
    )
    assert main(["train", str(manifest), "--output-dir", str(tmp_path / "r")]) == 2
    assert "algorithm.epsilon: Extra inputs are not permitted" in capsys.readouterr().err
    manifest.write_text(manifest.read_text().replace("  epsilon: 0.3\n", "").replace("grpo", "sft"))
    assert main(["train", str(manifest), "--output-dir", str(tmp_path / "r")]) == 2
    assert "env_type 'dataset'" in capsys.readouterr().err
    assert main(["train", str(EXAMPLES / "sft" / "manifest.yaml"), "--resume",
                 "--output-dir", str(tmp_path / "none")]) == 2
    assert "no checkpoint under" in capsys.readouterr().err


def test_model_from_a_local_folder_and_a_missing_hub_id(tmp_path):
    import os

    from agilerl.train.tiny_model import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    build_tiny_model(tokenizer, seed=3).save_pretrained(tmp_path / "saved")
    tokenizer.save_pretrained(tmp_path / "saved")
    model, loaded = load_model_and_tokenizer(ModelSettings(name_or_path="saved"), base_dir=tmp_path)
    assert model.config.model_type == "qwen2" and len(loaded) == 512
    manifest = tmp_path / "hub.yaml"
    manifest.write_text(
        "environment:\n  env_type: rollout\n  entrypoint: guess\n"
        "model:\n  name_or_path: agilerl-test/no-such-model\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "agilerl", "train", str(manifest), "--output-dir", str(tmp_path / "r")],
        check=False, capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "model.name_or_path 'agilerl-test/no-such-model': cannot load" in result.stderr
    assert "Use 'tiny'" in result.stderr


def test_model_from_a_gguf_file_loads_exactly_and_trains(tmp_path, capsys):
    import torch

    from agilerl.train.tiny_model import build_tiny_model, build_tiny_tokenizer
    from tests.tiny_gguf import write_tiny_gguf

    tokenizer = build_tiny_tokenizer()
    original = build_tiny_model(tokenizer, seed=3)
    write_tiny_gguf(tmp_path / "tiny.gguf", original, tokenizer)
    model, loaded = load_model_and_tokenizer(ModelSettings(name_or_path="tiny.gguf"), base_dir=tmp_path)
    text = "<|im_start|>user\nGuess 1234, then 56!<|im_end|>\n<|im_start|>assistant\n"
    assert loaded(text).input_ids == tokenizer(text).input_ids
    assert loaded.chat_template == tokenizer.chat_template and loaded.eos_token == "<|im_end|>"
    ids = torch.tensor([tokenizer(text).input_ids])
    torch.testing.assert_close(model(ids).logits, original(ids).logits)

    manifest = tmp_path / "gguf.yaml"
    manifest.write_text(
        "environment:\n  env_type: rollout\n  entrypoint: guess\n"
        "model:\n  name_or_path: tiny.gguf\n"
        "training:\n  batch_size: 2\n  group_size: 2\n  max_new_tokens: 3\n"
    )
    out = tmp_path / "run"
    capsys.readouterr()  # the load above may draw its bars; the run below must not
    code = main(["train", str(manifest), "--max-steps", "1", "--output-dir", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "Loading weights" not in err and "de-quantizing" not in err  # --no-progress: no bars at all
    saved, _ = load_model_and_tokenizer(ModelSettings(), checkpoint=out / "checkpoints" / "step-000001")
    assert saved.config.model_type == "qwen2" and saved.config.vocab_size == 512


def test_training_against_remote_env_replicas(tmp_path):
    from agilerl.assembly.from_manifest import train_from_manifest
    from agilerl.llm_envs.openenv_server import resolve_env
    from agilerl.registry import resolve

    guess_env = resolve("env", "guess")
    built: dict[str, int] = {"a": 0, "b": 0}

    def replica(name):
        def build():
            built[name] += 1
            return guess_env(target=7)
        return build

    url_a, server_a = resolve_env(replica("a"), max_concurrent_envs=4)
    url_b, server_b = resolve_env(replica("b"), max_concurrent_envs=4)
    with server_a, server_b:
        manifest = parse_manifest(
            {"environment": {"env_type": "rollout", "env_url": [url_a, url_b], "max_turns": 3},
             "training": {"batch_size": 2, "group_size": 3, "max_steps": 2, "max_new_tokens": 2,
                          "output_dir": str(tmp_path), "eval_episodes": 2}},
        )
        result = train_from_manifest(manifest, show_progress=False)
    assert result.step == 2 and "eval/reward" in result.metrics
    assert built["a"] >= 3 and built["b"] >= 3  # 6 rollout sessions + 1 evaluation, round robin


def test_docs_table_every_setting_and_the_python_example_runs(tmp_path, monkeypatch):
    import re

    from agilerl.manifest.settings import TrainingSettings

    text = (Path(__file__).resolve().parent.parent / "docs" / "training.md").read_text()
    for settings in (TrainingSettings, ModelSettings):
        documented = set(re.findall(r"^\| `(\w+)` \|", text, flags=re.MULTILINE))
        assert set(settings.model_fields) <= documented, set(settings.model_fields) - documented
    example = text.split("## From Python\n\n```python\n")[1].split("```")[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "docs/training.md", "exec"), {})  # noqa: S102 - the docs' own example
    assert (tmp_path / "runs" / "doc" / "checkpoints" / "step-000002").is_dir()


def test_micro_batches_accumulate_to_the_whole_batch_step(tmp_path):
    import torch

    from agilerl.data.dataset_env import DatasetEnv
    from agilerl.train.loops import train_llm_dataset

    manifest = load_manifest(EXAMPLES / "dpo" / "manifest.yaml")
    runs = {}
    for micro in (None, 1):
        model, tokenizer = load_model_and_tokenizer(manifest.model)
        dataset = DatasetEnv.from_spec(manifest.environment, tokenizer, base_dir=manifest.base_dir, batch_size=4)
        training = manifest.training.model_copy(update={
            "max_steps": 1, "micro_batch_size": micro, "evaluation_interval": 0, "lr": 1e-6,
            "output_dir": str(tmp_path / str(micro)),
        })
        result = train_llm_dataset(model, tokenizer, dataset, "dpo", training, show_progress=False)
        runs[micro] = (result.metrics, [p.detach().clone() for p in model.parameters()])
    (whole, whole_weights), (micro, micro_weights) = runs[None], runs[1]
    assert micro["train/loss"] == pytest.approx(whole["train/loss"], rel=1e-5)  # DPO: a mean over rows
    assert micro["algo/grad_norm"] == pytest.approx(whole["algo/grad_norm"], rel=1e-4)
    # Adam's first step moves each weight by about lr * sign(grad): the same step, within 2 lr
    assert all(torch.allclose(a, b, atol=2.1e-6, rtol=0) for a, b in zip(whole_weights, micro_weights))


def test_an_added_value_head_is_checkpointed_and_restored(tmp_path):
    import torch

    from agilerl.assembly.from_manifest import train_from_manifest

    manifest = parse_manifest(
        {"environment": {**GUESS, "max_turns": 2}, "algorithm": {"name": "llmppo"},
         "training": {"batch_size": 2, "group_size": 2, "max_steps": 2, "max_new_tokens": 3, "lr": 1e-2,
                      "output_dir": str(tmp_path), "evaluation_interval": 0}},
        base_dir=EXAMPLES / "guess",
    )
    first = train_from_manifest(manifest, show_progress=False)
    head = torch.load(first.checkpoint / "extra_params.pt", weights_only=True)
    assert sorted(head) == ["value_head.bias", "value_head.weight"]  # not the LM's own weights
    assert head["value_head.weight"].abs().sum() > 0  # trained away from its zero init

    from agilerl.builtins.algorithms import ppo

    restored = []
    original = ppo.ValueHeadModel.load_state_dict

    def spy(self, state, strict=True):
        restored.append({k: v.clone() for k, v in state.items()})
        return original(self, state, strict=strict)

    ppo.ValueHeadModel.load_state_dict = spy
    try:
        manifest.training.max_steps = 3
        assert train_from_manifest(manifest, resume="latest", show_progress=False).step == 3
    finally:
        ppo.ValueHeadModel.load_state_dict = original
    assert torch.equal(restored[0]["value_head.weight"], head["value_head.weight"])
