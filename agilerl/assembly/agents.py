"""From an agent ``environment:`` spec (``agent_command`` or ``agent``) to an ``AgentCollector``:
the agent runner, the task table split as a dataset rollout's, the rubrics and the endpoint's
bounds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agilerl.agents.programs import AgentRunner, CommandAgent, FunctionAgent
from agilerl.agents.source import AgentCollector
from agilerl.manifest.environment import AgentSpec

__all__ = ["agent_runner", "agent_collector_from_spec"]


def agent_runner(spec: AgentSpec, *, base_dir: str | Path | None = None) -> AgentRunner:
    """The spec's agent: its program (run in the manifest's folder) or its function."""
    needs_reward = not spec.rubrics  # without rubrics, the agent's own reward is the only one
    if spec.agent_command is not None:
        return CommandAgent(spec.agent_command, cwd=base_dir, needs_reward=needs_reward)
    from agilerl.registry.loading import load_object

    assert spec.agent is not None  # the spec's validator requires one of the two
    return FunctionAgent(load_object(spec.agent, base_dir), name=spec.agent, needs_reward=needs_reward)


def agent_collector_from_spec(
    spec: AgentSpec,
    tokenizer: Any,
    *,
    batch_size: int,
    group_size: int,
    base_dir: str | Path | None = None,
    **kwargs: Any,
) -> AgentCollector:
    """An ``AgentCollector`` for the spec; ``kwargs`` are the collector's own (sampling, seed,
    rank, world_size, model_name)."""
    from agilerl.assembly.datasets import load_spec_rubric, load_spec_table

    train_rows = eval_rows = None
    if spec.dataset is not None:
        from agilerl.data.tables import split_table

        table, config = load_spec_table(spec, base_dir=base_dir)  # type: ignore[arg-type]
        splits = split_table(table, spec.train_test_split, int(config.get("split_seed", 0)))
        train_rows, eval_rows = splits.train, splits.test
    rubric = load_spec_rubric(spec, base_dir=base_dir) if spec.rubrics else None  # type: ignore[arg-type]
    parser = spec.tool_parser
    if parser is not None and ".py:" in parser:
        from agilerl.registry.loading import load_object

        parser = load_object(parser, base_dir)
    return AgentCollector(
        agent_runner(spec, base_dir=base_dir),
        tokenizer,
        batch_size=batch_size,
        group_size=group_size,
        train_rows=train_rows,
        eval_rows=eval_rows,
        rubric=rubric,
        max_reward=spec.max_reward,
        max_turns=spec.max_turns,
        episode_timeout_s=spec.episode_timeout_s,
        failure_score=spec.failure_score,
        give_up_after_s=spec.give_up_after_s,
        tool_parser=parser,
        chat_template_kwargs=spec.chat_template_kwargs,
        max_request_bytes=spec.max_request_bytes,
        max_concurrent_calls=spec.max_concurrent_calls,
        **kwargs,
    )
