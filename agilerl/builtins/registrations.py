"""Registration of the built-ins, through the same hooks a third-party plugin implements.

Targets are ``"module:attr"`` strings, so listing never imports the implementations.
"""

from __future__ import annotations

from collections.abc import Callable

from agilerl import hookimpl

Register = Callable[..., None]

# (name, target, description); one list per kind.
ENVS: list[tuple[str, str, str]] = []
OBSERVATION_PROCESSORS: list[tuple[str, str, str]] = []
RUBRICS: list[tuple[str, str, str]] = []
ALGORITHMS: list[tuple[str, str, str]] = []


def _register_all(register: Register, entries: list[tuple[str, str, str]]) -> None:
    for name, target, description in entries:
        register(name, target, description=description)


@hookimpl
def register_envs(register: Register) -> None:
    _register_all(register, ENVS)


@hookimpl
def register_observation_processors(register: Register) -> None:
    _register_all(register, OBSERVATION_PROCESSORS)


@hookimpl
def register_rubrics(register: Register) -> None:
    _register_all(register, RUBRICS)


@hookimpl
def register_algorithms(register: Register) -> None:
    _register_all(register, ALGORITHMS)
