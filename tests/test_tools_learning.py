"""The tool-calling example learns (examples/tools): the OpenEnv MCP env served from the
openenv-core venv, a short SFT warm start on well-formed calls through the SFT path, then GRPO
through tool_parser; the reward and the rate of well-formed calls both rise.

Bounded by steps (SFT 80, GRPO 40); the timeout only catches a hang."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agilerl.manifest.spec import load_manifest, parse_env_spec
from tests.test_openenv_native import side_python  # noqa: F401 - the side venv fixture
from tests.test_remote_openenv import openenv_python  # noqa: F401

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tools"

pytestmark = pytest.mark.slow


@pytest.fixture
def served_env(side_python: Path):  # noqa: F811
    server = subprocess.Popen(
        [str(side_python), "-m", "agilerl", "serve", "calc_env.py:CalcToolsEnv", "--port", "0"],
        cwd=EXAMPLE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert server.stdout is not None
        line = next(line for line in server.stdout if line.startswith("serving "))
        yield line.split(" at ")[1].split()[0]
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.timeout(3000)
def test_sft_then_grpo_learns_to_call_the_tool_that_pays(served_env, tmp_path):
    from agilerl.assembly.models import load_model_and_tokenizer
    from agilerl.data.dataset_env import DatasetEnv
    from agilerl.remote.client import RemoteEnvClient
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.generation.policy import SamplingParams
    from agilerl.tools import function_tool
    from agilerl.train.loops import train_llm_dataset, train_llm_rollout
    from agilerl.train.metrics import read_metrics

    sft = load_manifest(EXAMPLE / "sft.yaml")
    grpo = load_manifest(EXAMPLE / "manifest.yaml")
    with RemoteEnvClient(served_env) as client:  # the warm start shows the tools the env lists
        client.reset(seed=0)
        assert [function_tool(t) for t in client.list_tools()] == sft.environment.chat_template_kwargs["tools"]

    model, tokenizer = load_model_and_tokenizer(sft.model, seed=sft.training.seed)
    dataset = DatasetEnv.from_spec(sft.environment, tokenizer, base_dir=sft.base_dir, batch_size=sft.training.batch_size)
    sft_training = sft.training.model_copy(update={"output_dir": str(tmp_path / "sft")})
    train_llm_dataset(model, tokenizer, dataset, "sft", sft_training, show_progress=False)

    spec = parse_env_spec({**grpo.environment.model_dump(by_alias=False, exclude_none=True), "env_url": served_env})
    training = grpo.training.model_copy(update={"output_dir": str(tmp_path / "grpo")})
    with RolloutCollector.from_spec(
        spec, tokenizer, seed=training.seed, batch_size=training.batch_size, group_size=training.group_size,
        sampling=SamplingParams(max_new_tokens=training.max_new_tokens),
    ) as collector:
        train_llm_rollout(model, tokenizer, collector, "grpo", training, show_progress=False)

    records = [r for r in read_metrics(tmp_path / "grpo" / "metrics.jsonl") if "train/reward" in r]
    rewards = [r["train/reward"] for r in records]
    well_formed = [r.get("tools/ok_calls_per_turn", 0.0) for r in records]
    first, last = slice(0, 5), slice(-5, None)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert mean(rewards[last]) > mean(rewards[first]) + 0.2, rewards
    assert mean(well_formed[last]) > mean(well_formed[first]), well_formed
    assert mean(rewards[last]) > 0.6, rewards
