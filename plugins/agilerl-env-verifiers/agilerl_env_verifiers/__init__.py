"""agilerl plugin: any verifiers v1 taskset as a text env (``entrypoint: verifiers``).

Registration never imports ``verifiers`` (seconds of imports): the target is a string.
"""

from __future__ import annotations

from agilerl import hookimpl


@hookimpl
def register_envs(register):
    register(
        "verifiers",
        "agilerl_env_verifiers.env:verifiers_env",
        description="A verifiers v1 taskset: env_config {taskset: 'module:attr' or id, mode: score|bridge}.",
    )
