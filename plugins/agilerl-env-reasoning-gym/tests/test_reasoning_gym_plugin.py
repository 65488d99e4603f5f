"""The reasoning-gym plugin, installed: registered names, rollouts scored by reasoning-gym."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agilerl.train.tiny_model import build_tiny_tokenizer
from agilerl.assembly.env_factory import make_env_factory
from agilerl.manifest.spec import parse_env_spec
from agilerl.llm_envs import RolloutHarness
from agilerl.registry import get_registry, reset_registry, resolve


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer("chatml")


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    monkeypatch.delenv("AGILERL_PLUGINS", raising=False)
    reset_registry()
    yield
    reset_registry()


def spec(**env_config):
    return parse_env_spec(
        {
            "env_type": "rollout",
            "entrypoint": "reasoning-gym",
            "env_config": {"dataset": "leg_counting", "size": 40, "seed": 3, **env_config},
        }
    )


def test_registered_through_the_entry_point_without_importing_reasoning_gym():
    code = (
        "import sys\nfrom agilerl.registry import get_registry\n"
        "r = get_registry()\nassert 'reasoning-gym' in r.names('env')\n"
        "assert 'reasoning-gym' in r.names('rubric')\n"
        "assert 'reasoning_gym' not in sys.modules, 'listing imported reasoning_gym'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    plugin = next(p for p in get_registry().plugins if p.name == "reasoning-gym")
    assert (plugin.distribution, plugin.status) == ("agilerl-env-reasoning-gym", "ok")
    assert plugin.provides == {"env": ["reasoning-gym"], "rubric": ["reasoning-gym"]}


def test_rollout_scored_by_reasoning_gym(tokenizer):
    factory = make_env_factory(spec())
    first, second = factory(), factory()
    assert first.data is second.data
    assert (first.dataset_size, first.eval_dataset_size, first.max_turns) == (36, 4, 1)
    harness = RolloutHarness.local(first, tokenizer)
    prompt_ids, info = harness.reset(row_index=5)
    text = tokenizer.decode(list(prompt_ids))
    assert text.startswith("<|im_start|>system\nGiven a problem, your task is to answer the question")
    assert "how many legs are there in total" in text
    answer = first.data.splits.train[5]["answer"]
    _, reward, terminated, _, step_info = harness.step(f"<think>add</think><answer>{answer}</answer>")
    assert (reward, terminated, step_info["accuracy"]) == (1.0, True, 1.0)
    harness.reset(row_index=5)
    assert harness.step(f"<answer>{int(answer) + 1}</answer>")[1] == 0.0
    harness.reset(row_index=0, evaluation=True)
    assert harness.step("no answer tags")[1] == 0.0


def test_same_arguments_same_rows_and_system_prompt_override():
    env = make_env_factory(spec())()
    again = make_env_factory(spec(system_prompt="Answer in <answer> tags."))()
    assert [env.reset(row_index=i)[0] for i in range(4)] == [again.reset(row_index=i)[0] for i in range(4)]
    assert again.reset(row_index=0)[1]["messages"][0] == {
        "role": "system",
        "content": "Answer in <answer> tags.",
    }
    other_seed = make_env_factory(spec(seed=4))()
    assert env.reset(row_index=0)[0] != other_seed.reset(row_index=0)[0]


@pytest.mark.parametrize("name", ["basic_arithmetic", "spell_backward", "word_sorting", "chain_sum"])
def test_other_datasets_score_their_own_answers(name):
    make_env = resolve("env", "reasoning-gym")
    env = make_env(name, size=10, seed=1)
    for row_index in range(3):
        env.reset(row_index=row_index)
        answer = env.data.splits.train[row_index]["answer"]
        assert env.step(f"<answer>{answer}</answer>")[1] == 1.0


def test_rubric_scores_a_file_of_exported_entries(tmp_path):
    import reasoning_gym

    from agilerl.data.qa_dataset import QADatasetEnv

    generated = reasoning_gym.create_dataset("leg_counting", size=6, seed=2)
    with open(tmp_path / "rg.jsonl", "w") as f:
        for entry in generated:
            row = {"question": entry["question"], "answer": entry["answer"], "metadata": json.dumps(entry["metadata"])}
            f.write(json.dumps(row) + "\n")
    file_spec = parse_env_spec(
        {"env_type": "rollout", "dataset": "rg.jsonl", "rubric_name": "reasoning-gym", "train_test_split": 0.5}
    )
    env = QADatasetEnv.from_spec(file_spec, base_dir=tmp_path)
    env.reset(row_index=1)
    answer = env.data.splits.train[1]["answer"]
    assert env.step(f"<answer>{answer}</answer>")[1] == 1.0


def test_unknown_dataset_names_the_fix():
    from agilerl_env_reasoning_gym.env import ReasoningGymError

    with pytest.raises(ReasoningGymError, match=r"could not create dataset 'no_such_task'.*DATASETS lists them"):
        make_env_factory(spec(dataset="no_such_task"))()
