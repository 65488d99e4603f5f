"""The hooks a plugin implements. Each receives a ``register`` callback, so the host alone
decides what a valid name is and what happens when two plugins claim the same one."""

from __future__ import annotations

from typing import Any, Protocol

import pluggy

__all__ = [
    "hookspec",
    "Register",
    "register_envs",
    "register_observation_processors",
    "register_rubrics",
    "register_algorithms",
    "register_models",
    "register_trackers",
    "register_generation_backends",
    "register_tool_parsers",
]

hookspec = pluggy.HookspecMarker("agilerl")


class Register(Protocol):
    """The callback every hook gets; typed, so a checker sees a plugin author's wrong call."""

    def __call__(self, name: str, target: Any, *, description: str = "") -> None:
        """Register ``target`` (the object, or a ``"module:attr"`` string imported on first use)."""


@hookspec
def register_envs(register: Register) -> None:
    """Register text environments (classes or factories called with ``env_config`` keywords)."""


@hookspec
def register_observation_processors(register: Register) -> None:
    """Register processors that turn a remote env's observation dict into prompt text."""


@hookspec
def register_rubrics(register: Register) -> None:
    """Register rubrics: callables that score a completion (keywords: completion, answer, ...)."""


@hookspec
def register_algorithms(register: Register) -> None:
    """Register training algorithms, named by ``algorithm.name`` in a manifest."""


@hookspec
def register_models(register: Register) -> None:
    """Register models named by ``model.name_or_path``: callables ``(*, seed) -> (model, tokenizer)``."""


@hookspec
def register_trackers(register: Register) -> None:
    """Register experiment trackers named by ``training.report_to``: callables ``(run) -> GeneralTracker``."""


@hookspec
def register_generation_backends(register: Register) -> None:
    """Register generation backends named by ``generation.backend``: ``(model, tokenizer, *, max_model_len, seed, **options) -> Policy``."""


@hookspec
def register_tool_parsers(register: Register) -> None:
    """Register tool-call parsers named by ``environment.tool_parser``: ``ToolParser`` subclasses, built with the tokenizer."""
