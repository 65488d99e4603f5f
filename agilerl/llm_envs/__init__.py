"""The documented import paths: everything a user, an env author or an algorithm author imports.

Importing this module is cheap: each name loads its defining module (and torch, transformers or
datasets, where it needs them) only when first used. ``agilerl.llm_envs.openenv``,
``.openenv_server`` and ``.qa_dataset`` are narrower views of the same names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agilerl.llm_envs._lazy import lazy_exports

_LAZY = {
    # the text-env protocol and the env side
    "TextEnv": "agilerl.protocol",
    "check_env": "agilerl.envs.checker",
    "CheckReport": "agilerl.envs.checker",
    "InProcessEnvClient": "agilerl.envs.client",
    "RemoteEnvClient": "agilerl.remote.client",
    "resolve_env": "agilerl.fleet.serving",  # isolation="venv" too; else agilerl.remote.hosting
    "adapt_openenv": "agilerl.envs.openenv_native",
    "process_observation": "agilerl.envs.observations",
    # manifests
    "load_manifest": "agilerl.manifest.spec",
    "Manifest": "agilerl.manifest.spec",
    "EnvironmentSpec": "agilerl.manifest.environment",
    "ModelSettings": "agilerl.manifest.settings",
    "TrainingSettings": "agilerl.manifest.settings",
    # plugins and names
    "hookimpl": "agilerl",
    "Register": "agilerl.registry.hookspecs",
    "resolve": "agilerl.registry.resolver",
    "get_registry": "agilerl.registry.resolver",
    "get_plugin_manager": "agilerl.registry.resolver",
    "reset_registry": "agilerl.registry.resolver",
    # dataset envs (the built-in rubrics are in _REGISTERED)
    "QADatasetEnv": "agilerl.data.qa_dataset",
    "DatasetEnv": "agilerl.data.dataset_env",
    "make_format_rubric": "agilerl.data.rubric",
    "Rubric": "agilerl.data.rubric",
    "Reward": "agilerl.data.reward",
    "CompositeRubric": "agilerl.data.composite",
    "RubricEntry": "agilerl.data.composite",
    "RubricGate": "agilerl.data.composite",
    # rollouts
    "RolloutHarness": "agilerl.rollout.harness",
    "Trajectory": "agilerl.rollout.trajectory",
    "RolloutCollector": "agilerl.rollout.collector",
    "TaskAssigner": "agilerl.rollout.assigner",
    "Task": "agilerl.rollout.assigner",
    "Policy": "agilerl.generation.policy",
    "SamplingParams": "agilerl.generation.policy",
    "Generation": "agilerl.generation.policy",
    "TransformersPolicy": "agilerl.generation.policy",
    "VLLMPolicy": "agilerl.generation.vllm.policy",
    "VLLMServerPolicy": "agilerl.generation.vllm.server",
    "WeightSyncedPolicy": "agilerl.generation.backends",
    "build_generation": "agilerl.generation.backends",
    "hf_weights": "agilerl.generation.weights",
    "ScriptedPolicy": "agilerl.generation.policy",
    "RolloutBatch": "agilerl.rollout.results",
    "CollectStats": "agilerl.rollout.results",
    "SlotFailure": "agilerl.rollout.results",
    "EvalResult": "agilerl.rollout.results",
    "OpenAIChatPolicy": "agilerl.generation.openai_policy",
    "MessageTokenizer": "agilerl.generation.openai_policy",
    # tool calls in the model's own format (a parser is a plugin kind: register_tool_parsers)
    "ToolParser": "agilerl.tools",
    "BodyCall": "agilerl.tools",
    "ToolCall": "agilerl.tools",
    "ToolSet": "agilerl.tools",
    "ParsedCompletion": "agilerl.tools",
    "resolve_tool_parser": "agilerl.tools",
    # evaluation (agilerl eval)
    "EvalPlan": "agilerl.assembly.evaluation",
    "EvalSummary": "agilerl.assembly.evaluation",
    "evaluate_spec": "agilerl.assembly.evaluation",
    "pass_at_k": "agilerl.assembly.evaluation",
    # training
    "Algorithm": "agilerl.train.algorithm",
    "AlgorithmConfig": "agilerl.train.algorithm",
    "build_algorithm": "agilerl.train.algorithm",
    "RolloutTensors": "agilerl.train.batch",
    "collate_trajectories": "agilerl.train.batch",
    "masked_mean": "agilerl.train.logprobs",
    "policy_logprobs": "agilerl.train.logprobs",
    "train_llm_rollout": "agilerl.train.loops",
    "train_llm_dataset": "agilerl.train.loops",
    "TrainResult": "agilerl.train.loops",
    "load_model_and_tokenizer": "agilerl.assembly.models",
    "train_from_manifest": "agilerl.assembly.from_manifest",
    "build_tiny_tokenizer": "agilerl.train.tiny_model",
    "build_tiny_model": "agilerl.train.tiny_model",
    # TRL's GRPOTrainer over our envs (agilerl.integrations.trl)
    "EnvRollout": "agilerl.integrations.trl",
    "env_reward": "agilerl.integrations.trl",
    "task_prompt": "agilerl.integrations.trl",
    # errors (one tree, rooted at AgileRLError)
    "AgileRLError": "agilerl.errors",
    "ConfigError": "agilerl.errors",
    "ManifestError": "agilerl.errors",
    "MissingExtra": "agilerl.errors",
    "RegistrationError": "agilerl.errors",
    "NameNotRegistered": "agilerl.errors",
    "EnvCheckError": "agilerl.errors",
    "RemoteEnvError": "agilerl.errors",
    "RemoteEnvTimeout": "agilerl.errors",
    "RubricError": "agilerl.errors",
    "CollectionError": "agilerl.errors",
    "EndpointError": "agilerl.errors",
}

_REGISTERED: dict[str, tuple[Kind, str]] = {
    name: ("rubric", name)
    for name in ("exact_match", "numeric_match", "boxed_match", "think_answer_format", "countdown")
}
"""The built-in rubrics, served by the registry: the core never imports the built-ins' modules."""

__all__ = [*_LAZY, *_REGISTERED]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, _REGISTERED)

if TYPE_CHECKING:
    from collections.abc import Callable

    from agilerl import hookimpl
    from agilerl.registry.hookspecs import Register
    from agilerl.registry.registry import Kind
    from agilerl.assembly.evaluation import EvalPlan, EvalSummary, evaluate_spec, pass_at_k
    from agilerl.assembly.from_manifest import train_from_manifest
    from agilerl.assembly.models import load_model_and_tokenizer
    from agilerl.data.composite import CompositeRubric, RubricEntry, RubricGate
    from agilerl.data.reward import Reward
    from agilerl.data.rubric import Rubric, make_format_rubric
    from agilerl.train.tiny_model import build_tiny_model, build_tiny_tokenizer

    exact_match: Callable[..., float]
    numeric_match: Callable[..., float]
    boxed_match: Callable[..., float]
    think_answer_format: Callable[..., float]
    countdown: Callable[..., float]
    from agilerl.data.dataset_env import DatasetEnv
    from agilerl.data.qa_dataset import QADatasetEnv
    from agilerl.envs.checker import CheckReport, check_env
    from agilerl.envs.client import InProcessEnvClient
    from agilerl.envs.observations import process_observation
    from agilerl.envs.openenv_native import adapt_openenv
    from agilerl.integrations.trl import EnvRollout, env_reward, task_prompt
    from agilerl.errors import (
        AgileRLError,
        CollectionError,
        ConfigError,
        EndpointError,
        EnvCheckError,
        ManifestError,
        MissingExtra,
        NameNotRegistered,
        RegistrationError,
        RemoteEnvError,
        RemoteEnvTimeout,
        RubricError,
    )
    from agilerl.manifest.settings import ModelSettings, TrainingSettings
    from agilerl.manifest.environment import EnvironmentSpec
    from agilerl.manifest.spec import Manifest, load_manifest
    from agilerl.protocol import TextEnv
    from agilerl.registry.resolver import get_plugin_manager, get_registry, reset_registry, resolve
    from agilerl.remote.client import RemoteEnvClient
    from agilerl.fleet.serving import resolve_env
    from agilerl.rollout.assigner import Task, TaskAssigner
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.rollout.harness import RolloutHarness
    from agilerl.generation.openai_policy import MessageTokenizer, OpenAIChatPolicy
    from agilerl.generation.backends import WeightSyncedPolicy, build_generation
    from agilerl.generation.policy import Generation, Policy, SamplingParams, ScriptedPolicy, TransformersPolicy
    from agilerl.generation.vllm.policy import VLLMPolicy
    from agilerl.generation.vllm.server import VLLMServerPolicy
    from agilerl.generation.weights import hf_weights
    from agilerl.rollout.results import CollectStats, EvalResult, RolloutBatch, SlotFailure
    from agilerl.rollout.trajectory import Trajectory
    from agilerl.train.algorithm import Algorithm, AlgorithmConfig, build_algorithm
    from agilerl.train.batch import RolloutTensors, collate_trajectories
    from agilerl.train.loops import TrainResult, train_llm_dataset, train_llm_rollout
    from agilerl.train.logprobs import masked_mean, policy_logprobs
