"""The mapping behind the documented ``RolloutHarness.from_spec`` and ``RolloutCollector.from_spec``
doors: a manifest's ``environment:`` section to the objects those classes take."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from agilerl.assembly.env_factory import first_then, make_env_factory, rollout_spec
from agilerl.manifest.environment import EnvironmentSpec
from agilerl.manifest.spec import parse_env_spec
from agilerl.protocol import close_env

if TYPE_CHECKING:
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.rollout.harness import RolloutHarness

    Harness = TypeVar("Harness", bound=RolloutHarness)
    Collector = TypeVar("Collector", bound=RolloutCollector)

__all__ = ["harness_from_spec", "collector_from_spec", "tool_kwargs"]


def tool_kwargs(rollout: Any, base_dir: str | Path | None = None) -> dict[str, Any]:
    """The harness's tool-call keywords from a rollout's ``tool_parser``/``send_reasoning``
    (none without a parser: the env gets the model's text, as before). A ``file.py:attr`` parser
    is resolved against the manifest's folder."""
    parser = getattr(rollout, "tool_parser", None)
    if parser is None:
        return {}
    if ".py:" in parser and base_dir is not None:
        from agilerl.registry.loading import load_object

        parser = load_object(parser, base_dir)
    return {"tool_parser": parser, "send_reasoning": rollout.send_reasoning}


def harness_from_spec(
    harness: type[Harness],
    spec: EnvironmentSpec,
    tokenizer: Any,
    *,
    base_dir: str | Path | None = None,
    mcp_tool: str | None = None,
    **kwargs: Any,
) -> Harness:
    """One env of the spec's source in a ``harness``, with the spec's turn budget (else the env's
    own); ``mcp_tool`` overrides the spec's (validated again: it must fit the source)."""
    if mcp_tool is not None:
        spec = parse_env_spec({**spec.model_dump(by_alias=False, exclude_none=True), "mcp_tool": mcp_tool})
    rollout = rollout_spec(spec)
    factory = make_env_factory(rollout, base_dir=base_dir)
    kwargs.setdefault("chat_template_kwargs", rollout.chat_template_kwargs)
    kwargs.setdefault("context_policy", rollout.context_policy)
    kwargs.update(tool_kwargs(rollout, base_dir))
    env = factory()
    try:
        return harness(env, tokenizer, max_turns=rollout.max_turns, **kwargs)
    except BaseException:
        close_env(env)  # built here, so closed here when the harness cannot take it
        raise


def collector_from_spec(
    collector: type[Collector],
    spec: EnvironmentSpec,
    tokenizer: Any,
    *,
    batch_size: int,
    group_size: int,
    base_dir: str | Path | None = None,
    first_env: Any = None,
    **kwargs: Any,
) -> Collector:
    """A ``collector`` over envs of the spec's source, with its turn budget (else the env's own),
    reward scale and timeout; ``first_env``, one of the spec's envs already built, is its first."""
    rollout = rollout_spec(spec)
    factory = make_env_factory(rollout, base_dir=base_dir, sessions=batch_size * group_size + 1)  # + evaluation's
    if first_env is not None:
        factory = first_then(first_env, factory)
    kwargs.setdefault("max_turns", rollout.max_turns)
    kwargs.setdefault("chat_template_kwargs", rollout.chat_template_kwargs)
    kwargs.setdefault("max_reward", rollout.max_reward)
    kwargs.setdefault("env_timeout_s", rollout.request_timeout_s or None)
    kwargs.setdefault("context_policy", rollout.context_policy)
    kwargs.update(tool_kwargs(rollout, base_dir))
    return collector(factory, tokenizer, batch_size=batch_size, group_size=group_size, **kwargs)
