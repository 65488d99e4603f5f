"""From an env name (registered, ``module:attr`` or ``file.py:attr``) to a zero-argument factory.

The server builds one env per session with it; ``agilerl.assembly.env_factory`` adds the manifest's other
sources (URLs, datasets) on top. An OpenEnv ``Environment`` class (or an installed OpenEnv
package) is wrapped in :class:`~agilerl.envs.openenv_native.OpenEnvTextEnv` on the way.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agilerl.envs.openenv_native import (
    ADAPTER_OPTIONS,
    AcceptedKeywords,
    adapt_openenv,
    check_options,
    is_openenv_environment,
)
from agilerl.errors import InvalidArgument, LoadError, MissingExtra
from agilerl.registry import resolve
from agilerl.registry.openenv_packages import OpenEnvPackage

__all__ = ["EnvFactory", "entrypoint_factory"]

EnvFactory = Callable[[], Any]


def entrypoint_factory(
    entrypoint: str | Callable[..., Any],
    env_config: dict[str, Any] | None = None,
    *,
    base_dir: str | Path | None = None,
    install: list[str] | None = None,
    options_in_config: bool = False,
    **openenv_options: Any,
) -> EnvFactory:
    """A factory calling ``entrypoint(**env_config)``; ``system_prompt`` is set after construction.

    For an OpenEnv env, ``openenv_options`` (``action_field``, ``observation_field``,
    ``observation_processor``, ``mcp_tool``, ``action_type``: a manifest's top-level fields)
    configure the text adapter; ``env_config`` holds only the env's own arguments, unless
    ``options_in_config`` (``agilerl serve --env-config``, which has no other place): then an
    adapter option there that the env's constructor does not take is the adapter's.
    """
    unknown = set(openenv_options) - set(ADAPTER_OPTIONS)
    if unknown:
        raise TypeError(f"entrypoint_factory() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
    target = _resolve(entrypoint, base_dir, install)
    options: dict[str, Any] = {}
    if isinstance(target, OpenEnvPackage):
        options["action_type"] = target.action_class()
        target = target.environment_class()
    if not callable(target):
        raise LoadError(
            f"entrypoint {entrypoint!r} resolved to {type(target).__name__}, which is not callable; "
            "name an env class or a function that returns an env"
        )
    config = dict(env_config or {})
    system_prompt = config.pop("system_prompt", None)
    openenv = is_openenv_environment(target)
    given = {k: v for k, v in openenv_options.items() if v is not None}
    if given and not openenv:
        raise InvalidArgument(
            f"{', '.join(sorted(given))} set for {entrypoint!r}, which is not an OpenEnv Environment: these "
            "options shape how an OpenEnv env (or an env_url server) reads the model's text; a text "
            "env gets the text in step() directly, so remove them."
        )
    if openenv and isinstance(target, type):
        given = {**_adapter_options_in_env_config(target, config, given, take=options_in_config), **given}
    options.update(given)
    if options.get("action_type") is None:
        options.pop("action_type", None)
    if isinstance(options.get("action_type"), str):
        options["action_type"] = resolve("env", options["action_type"], base_dir=base_dir)
    if openenv and isinstance(target, type):
        check_options(target, options)  # a misconfigured adapter fails here, not once per session

    def build() -> Any:
        env = target(**config)
        if is_openenv_environment(env):  # an OpenEnv class, or a function that returns one
            env = adapt_openenv(env, base_dir=base_dir, **options)
        if system_prompt is not None:
            env.system_prompt = system_prompt
        return env

    return build


def _adapter_options_in_env_config(
    env_cls: type, config: dict[str, Any], given: dict[str, Any], *, take: bool
) -> dict[str, Any]:
    """``env_config`` is the env's constructor arguments: an adapter option there that the
    constructor does not take is misplaced. With ``take`` it is moved out of ``config`` and
    returned (an option given both ways, differently, is an error); else the error says where it goes."""
    takes = AcceptedKeywords(env_cls)
    misplaced = [k for k in ADAPTER_OPTIONS if k in config and k not in takes]
    if not misplaced:
        return {}
    if take:
        clashes = [k for k in misplaced if k in given and given[k] != config[k]]
        if clashes:
            k = clashes[0]
            raise InvalidArgument(
                f"{k} is given twice, as --{k.replace('_', '-')} {given[k]} and in --env-config as "
                f"{config[k]!r}; keep one."
            )
        return {k: config.pop(k) for k in misplaced}
    names = ", ".join(misplaced)
    moves = ", ".join(f"{k}: {config[k]}" for k in misplaced)
    raise InvalidArgument(
        f"env_config.{misplaced[0]}: env_config holds {env_cls.__name__}'s own arguments and it "
        f"takes no {names}; the adapter's options are fields of the manifest's environment: "
        f"section ({moves}), keywords of entrypoint_factory(), or --{misplaced[0].replace('_', '-')} "
        "for agilerl env check and agilerl serve."
    )


def _resolve(entrypoint: str | Callable[..., Any], base_dir: str | Path | None, install: list[str] | None) -> Any:
    if not isinstance(entrypoint, str):
        return entrypoint
    with MissingExtra.translate(f"env {entrypoint!r}"):  # a file.py that imports an extra's module
        return resolve("env", entrypoint, base_dir=base_dir, install=install)
