"""The countdown, SFT and DPO examples: manifests validate and run on a few rows."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from agilerl.manifest.spec import load_manifest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("name", ["countdown", "sft", "dpo"])
def test_manifest_validates_without_warnings(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        manifest = load_manifest(EXAMPLES / name / "manifest.yaml")
    assert manifest.model.name_or_path == "tiny"
    assert manifest.algorithm.name == {"countdown": "grpo", "sft": "sft", "dpo": "dpo"}[name]
    assert manifest.training.max_steps <= 5


def test_countdown_data_script_is_deterministic(tmp_path):
    script = EXAMPLES / "countdown" / "make_data.py"
    out = tmp_path / "again.parquet"
    subprocess.run([sys.executable, str(script), "--out", str(out)], check=True, capture_output=True)
    assert pq.read_table(out).equals(pq.read_table(EXAMPLES / "countdown" / "countdown.parquet"))


def test_countdown_rolls_out_with_scripted_completions(chatml_tokenizer):
    from agilerl.assembly.env_factory import make_env_factory
    from agilerl.rollout.harness import RolloutHarness

    manifest = load_manifest(EXAMPLES / "countdown" / "manifest.yaml")
    factory = make_env_factory(manifest.environment, base_dir=manifest.base_dir)
    env = factory()
    assert (env.dataset_size, env.eval_dataset_size, env.max_turns) == (180, 20, 1)
    harness = RolloutHarness.local(env, chatml_tokenizer)
    for row_index in range(3):
        prompt_ids, info = harness.reset(row_index=row_index)
        row = env.data.splits.train[row_index]
        text = chatml_tokenizer.decode(list(prompt_ids))
        assert f"Using the numbers {row['question']}, create an equation that equals {row['answer']}." in text
        assert text.startswith("<|im_start|>system\nYou are a helpful assistant.")
        solved = f"<think>try it</think>\n<answer>{row['solution']}</answer>"
        _, reward, terminated, _, step_info = harness.step(solved)
        assert terminated and reward == pytest.approx(1.1)
        assert step_info["reward_components"] == {"format": pytest.approx(0.1), "equation": 1.0}
        assert step_info["accuracy"] == pytest.approx(1.0)
    harness.reset(row_index=0, evaluation=True)
    assert harness.step("<answer>1 + 1</answer>")[1] == 0.0


@pytest.mark.parametrize(("name", "keys"), [("sft", "labels"), ("dpo", "chosen_loss_mask")])
def test_dataset_examples_batch(name, keys, chatml_tokenizer):
    from agilerl.data.dataset_env import DatasetEnv

    manifest = load_manifest(EXAMPLES / name / "manifest.yaml")
    env = DatasetEnv.from_spec(
        manifest.environment,
        chatml_tokenizer,
        base_dir=manifest.base_dir,
        batch_size=manifest.training.batch_size,
    )
    assert (env.dataset_size, env.eval_dataset_size) == (16, 4)
    batches = list(env.batches(0))
    assert len(batches) == 4 and keys in batches[0]
    mask = batches[0]["loss_mask" if name == "sft" else "chosen_loss_mask"]
    assert mask.any(dim=1).all()


def test_docs_example_runs_and_every_built_in_rubric_is_documented(capsys):
    import re

    from agilerl.builtins.registrations import RUBRICS

    text = (EXAMPLES.parent / "docs" / "datasets.md").read_text()
    exec(compile(re.findall(r"```python\n(.*?)```", text, re.S)[-1], "docs/datasets.md", "exec"), {})
    assert capsys.readouterr().out.splitlines()[1:] == ["1.0", "Hello.<|im_end|>", ""]
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", text, re.M))
    assert {name for name, _, _ in RUBRICS} <= documented
