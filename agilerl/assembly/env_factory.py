"""From an ``environment:`` spec to a zero-argument env factory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agilerl.envs.entrypoints import EnvFactory, entrypoint_factory
from agilerl.errors import InvalidArgument, redact
from agilerl.manifest.environment import (
    AgentSpec, EntrypointSpec, EnvironmentSpec, EnvUrlSpec, RolloutSource, ScoredDatasetSpec,
)

__all__ = ["first_then", "make_env_factory", "placement", "rollout_spec"]


def make_env_factory(
    spec: EnvironmentSpec, *, base_dir: str | Path | None = None, sessions: int | None = None
) -> EnvFactory:
    """Resolve the spec's source once; each call of the result builds one fresh env (or client).
    ``sessions``, the envs the caller holds at once when known, sizes a ``replicas: auto`` fleet."""
    spec = rollout_spec(spec)
    if isinstance(spec, EnvUrlSpec):
        from agilerl.remote.client import RemoteEnvClient

        urls = spec.env_urls

        def remote() -> Any:
            return RemoteEnvClient(
                urls if len(urls) > 1 else urls[0],
                action_field=spec.action_field,
                observation_field=spec.observation_field,
                observation_processor=spec.observation_processor,
                image_field=spec.image_field,
                mcp_tool=spec.mcp_tool,
                request_timeout_s=spec.request_timeout_s,
                heartbeat_s=spec.heartbeat_s,
                retry_budget_s=spec.reconnect_timeout_s,
                base_dir=base_dir,
            )

        return remote
    if isinstance(spec, ScoredDatasetSpec):
        from agilerl.assembly.datasets import qa_env_factory

        return qa_env_factory(spec, base_dir=base_dir)
    if spec.placement != "in_process":  # served by replicas (a venv of its own, Ray): a fleet
        from agilerl.fleet.factory import fleet_env_factory

        return fleet_env_factory(spec, base_dir=base_dir, sessions=sessions)
    return entrypoint_factory(
        spec.entrypoint,
        spec.env_config,
        base_dir=base_dir,
        install=spec.env_packages.packages if spec.env_packages else None,
        action_field=spec.action_field,  # None: an OpenEnv adapter finds the field itself
        observation_field=spec.observation_field,
        observation_processor=spec.observation_processor,
        image_field=spec.image_field,
        mcp_tool=spec.mcp_tool,
        action_type=spec.action_type,
    )


def placement(spec: EnvironmentSpec) -> str | None:
    """Where a rollout's env runs, for a header (``env: ...``); None for a fleet, which says
    where each of its replicas runs as it starts, and for what is no env."""
    if isinstance(spec, EntrypointSpec):
        return f"{spec.entrypoint} in process (the trainer's interpreter)" if spec.placement == "in_process" else None
    if isinstance(spec, EnvUrlSpec):
        return f"remote at {', '.join(map(redact, spec.env_urls))}"
    if isinstance(spec, ScoredDatasetSpec):
        return f"dataset {spec.dataset} in process"
    if isinstance(spec, AgentSpec):
        agent = " ".join(spec.agent_command) if spec.agent_command is not None else f"{spec.agent} in process"
        return f"agent program {agent}, once per episode, against the trainer's endpoint"
    return None


def rollout_spec(spec: EnvironmentSpec) -> RolloutSource:
    """``spec``, refused when it is SFT/preference data rather than an env to roll out."""
    if isinstance(spec, AgentSpec):
        raise InvalidArgument(
            "an agent program ('agent_command' or 'agent') is no reset/step env: it plays whole "
            "episodes against the served policy (agilerl.agents.AgentCollector); try it with "
            "`agilerl eval MANIFEST -n 1`, train it with `agilerl train MANIFEST`"
        )
    if not isinstance(spec, (EntrypointSpec, EnvUrlSpec, ScoredDatasetSpec)):
        raise InvalidArgument(
            f"env_type {spec.env_type!r} has no env factory: it is data for "
            "train_llm_dataset (DatasetEnv), not an env to roll out"
        )
    return spec


def first_then(first: Any, factory: EnvFactory) -> EnvFactory:
    """``factory`` whose first call returns ``first``, an env already built (to read its
    ``describe()`` before a collector existed), so no env is built only to be looked at."""
    spare = [first]

    def build() -> Any:
        return spare.pop() if spare else factory()

    if hasattr(factory, "close"):  # a fleet's factory: whoever closes this one stops the fleet
        build.close = factory.close  # type: ignore[attr-defined]
    return build
