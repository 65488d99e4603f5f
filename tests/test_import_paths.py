"""The documented import paths (DESIGN.md contract) import; the retired names do not exist."""

from __future__ import annotations

import importlib

import pytest

PUBLIC = (
    "agilerl",
    "agilerl.llm_envs",
    "agilerl.llm_envs.openenv",
    "agilerl.llm_envs.openenv_server",
    "agilerl.llm_envs.qa_dataset",
    "agilerl.integrations.trl",
)
DOCUMENTED = [
    ("agilerl.llm_envs", "RolloutHarness"),
    ("agilerl.llm_envs.openenv", "InProcessEnvClient"),
    ("agilerl.llm_envs.openenv", "RemoteEnvClient"),
    ("agilerl.llm_envs.openenv_server", "resolve_env"),
    ("agilerl.llm_envs.qa_dataset", "QADatasetEnv"),
    ("agilerl.llm_envs.qa_dataset", "DatasetEnv"),
    ("agilerl.llm_envs", "RolloutCollector"),
    ("agilerl.llm_envs", "TaskAssigner"),
    ("agilerl.llm_envs", "train_llm_rollout"),
    ("agilerl.llm_envs", "train_llm_dataset"),
    ("agilerl", "hookimpl"),
    ("agilerl", "AgileRLError"),
]
RETIRED = [
    "HuggingFaceGym", "ReasoningGym", "SyncMultiTurnVecEnv", "SFTGym", "PreferenceGym",
    "PromptDatasetEnv", "IterablePromptBatchGym", "TokenObservationWrapper",
    "finetune_llm_reasoning", "finetune_llm_multiturn",
]


@pytest.mark.parametrize(("module", "name"), DOCUMENTED)
def test_documented_name_imports(module, name):
    imported = importlib.import_module(module)
    assert callable(getattr(imported, name))
    assert name in imported.__all__


@pytest.mark.parametrize("name", RETIRED)
def test_retired_name_is_gone(name):
    for module in PUBLIC:
        imported = importlib.import_module(module)
        with pytest.raises(AttributeError):
            getattr(imported, name)
        assert name not in imported.__all__


@pytest.mark.parametrize("module", PUBLIC)
def test_no_name_of_a_retired_family_is_exported(module):
    exported = importlib.import_module(module).__all__
    assert not [n for n in exported if n.startswith("finetune_llm_") or n.endswith("Gym")]


def test_harness_from_the_documented_path_is_the_core_one():
    from agilerl.rollout.harness import RolloutHarness
    from agilerl.llm_envs import RolloutHarness as Documented

    assert Documented is RolloutHarness
