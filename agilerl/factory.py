"""From an ``environment:`` spec to a zero-argument env factory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agilerl.envs.entrypoints import EnvFactory, entrypoint_factory
from agilerl.envs.openenv_native import ADAPTER_OPTIONS
from agilerl.errors import InvalidArgument
from agilerl.manifest.spec import EnvironmentSpec


def make_env_factory(spec: EnvironmentSpec, *, base_dir: str | Path | None = None) -> EnvFactory:
    """Resolve the spec's source once; each call of the result builds one fresh env (or client)."""
    if spec.env_type != "rollout":
        raise InvalidArgument(
            f"env_type {spec.env_type!r} has no env factory: it is data for "
            "train_llm_dataset (DatasetEnv), not an env to roll out"
        )
    if spec.env_url:
        from agilerl.remote.client import RemoteEnvClient

        urls = spec.env_urls

        def remote() -> Any:
            return RemoteEnvClient(
                urls if len(urls) > 1 else urls[0],
                action_field=spec.action_field,
                observation_field=spec.observation_field,
                observation_processor=spec.observation_processor,
                mcp_tool=spec.mcp_tool,
                request_timeout_s=spec.request_timeout_s,
                retry_budget_s=spec.reconnect_timeout_s,
                base_dir=base_dir,
            )

        return remote
    if spec.dataset:
        from agilerl.data.qa_dataset import qa_env_factory

        return qa_env_factory(spec, base_dir=base_dir)
    assert spec.entrypoint is not None  # the spec's own rules guarantee one source
    # how an OpenEnv-native env reads the model's text and writes the prompt (set fields only:
    # unset, the adapter finds the action field itself)
    adapter = {
        name: getattr(spec, name)
        for name in ADAPTER_OPTIONS
        if name in spec.model_fields_set and getattr(spec, name) is not None
    }
    return entrypoint_factory(
        spec.entrypoint,
        spec.env_config,
        base_dir=base_dir,
        install=spec.env_packages.packages if spec.env_packages else None,
        **adapter,
    )
