"""From an ``environment:`` spec to a zero-argument env factory, and the spec's turn budget."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agilerl.envs.entrypoints import EnvFactory, entrypoint_factory
from agilerl.envs.openenv_native import ADAPTER_OPTIONS
from agilerl.errors import InvalidArgument
from agilerl.manifest.spec import EnvironmentSpec
from agilerl.protocol import close_env, max_turns_problem

_PROBED_MAX_TURNS: dict[tuple[str, str], int] = {}


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


def resolve_max_turns(spec: EnvironmentSpec, factory: EnvFactory) -> int:
    """The spec's ``max_turns``, else probed off one throwaway env and cached per source."""
    if spec.max_turns is not None:
        return spec.max_turns
    if spec.dataset:
        return 1
    source = str(spec.env_urls if spec.env_url else spec.entrypoint)
    key = (source, json.dumps(spec.env_config, sort_keys=True, default=repr))
    if key not in _PROBED_MAX_TURNS:
        env = factory()
        try:
            max_turns = getattr(env, "max_turns", None)  # a remote client reads /metadata
        finally:
            close_env(env)
        if max_turns_problem(max_turns) is not None:
            where = (
                f"the server at {source} does not publish a usable max_turns in /metadata "
                "(OpenEnv servers do not)"
                if spec.env_url
                else f"the env from {spec.entrypoint!r} has no usable max_turns attribute"
            )
            raise InvalidArgument(
                f"environment.max_turns is not set and {where} (got {max_turns!r}); set max_turns "
                "in the manifest (agilerl env check: --max-turns N)"
            )
        _PROBED_MAX_TURNS[key] = max_turns
    return _PROBED_MAX_TURNS[key]
