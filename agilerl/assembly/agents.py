"""From an agent ``environment:`` spec (``agent_command`` or ``agent``) to an ``AgentCollector``:
the agent runner, the task table split as a dataset rollout's, the rubrics and the endpoint's
bounds."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

from agilerl.agents.programs import AgentRunner, CommandAgent, FunctionAgent
from agilerl.agents.source import AgentCollector
from agilerl.manifest.environment import AgentSpec
from agilerl.peers import secret_from_env

__all__ = ["agent_runner", "agent_collector_from_spec", "evaluate_agents"]


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


def evaluate_agents(
    spec: AgentSpec, policy: Any, tokenizer: Any, plan: Any, *, base_dir: str | Path | None = None,
) -> Any:
    """``agilerl eval`` of an agent (``evaluate_spec``'s branch): its episodes against a local
    ``policy`` served on the endpoint (every call's tokens recorded), or, for an OpenAI-compatible
    endpoint's policy (``--base-url``), against that endpoint directly: the program is handed its
    URL and key, and only its reward is recorded. One row per episode in ``plan.output``."""
    from agilerl.assembly.evaluation import ResultsFile, _row, _summary
    from agilerl.generation.openai_policy import OpenAIChatPolicy
    from agilerl.generation.versioned import VersionedPolicy
    from agilerl.rollout.assigner import Task

    base_url = api_key = None
    if isinstance(policy, OpenAIChatPolicy):
        base_url = policy.base_url
        api_key = policy._headers.get("Authorization", "").removeprefix("Bearer ") or None
    model_name = str(plan.label.get("model") or "agilerl-policy")
    collector = agent_collector_from_spec(
        spec, tokenizer, batch_size=plan.concurrency, group_size=1, base_dir=base_dir, sampling=plan.sampling,
        seed=plan.seed, model_name=model_name,
    ) if base_url is None else None
    if collector is None:
        from agilerl.assembly.datasets import load_spec_table
        from agilerl.data.tables import split_table

        held_rows = None
        if spec.dataset is not None:
            table, config = load_spec_table(spec, base_dir=base_dir)  # type: ignore[arg-type]
            held_rows = split_table(table, spec.train_test_split, int(config.get("split_seed", 0))).test
        runner = agent_runner(spec, base_dir=base_dir)
    else:
        held_rows = collector.eval_rows
    held_out = len(held_rows) if held_rows is not None else None
    max_reward = plan.max_reward if plan.max_reward is not None else spec.max_reward
    num_tasks = plan.num_tasks or held_out or 8
    if held_out is not None:
        num_tasks = min(num_tasks, held_out)
    episodes = [(t, s) for t in range(num_tasks) for s in range(plan.samples)]
    results = ResultsFile(plan.output, plan.label, resume=plan.resume)
    todo = [e for e in episodes if e not in results.rows]
    evaluation = True if held_out is not None else None
    try:
        for start in range(0, len(todo), plan.concurrency):
            chunk = todo[start : start + plan.concurrency]
            tasks = [Task(plan.seed + t, t if held_out is not None else None) for t, _ in chunk]
            if collector is not None:
                versioned = policy if isinstance(policy, VersionedPolicy) else VersionedPolicy(policy)
                trajectories = collector.play(tasks, versioned, evaluation=evaluation).trajectories
            else:
                trajectories = _play_direct(spec, runner, tasks, held_rows, base_url or "", api_key)
            results.extend(_row(t, s, traj, max_reward, plan) for (t, s), traj in zip(chunk, trajectories))
    finally:
        if collector is not None:
            collector.close()
    return _summary(results, episodes, plan, max_reward, played=len(todo), resumed=len(episodes) - len(todo))


def _play_direct(
    spec: AgentSpec, runner: AgentRunner, tasks: list[Any], rows: Any, base_url: str, api_key: str | None
) -> list[Any]:
    """Run the agents of ``tasks`` at once against ``base_url`` itself: their rewards only."""
    from agilerl.rollout.trajectory import Trajectory

    cancel = threading.Event()
    outcomes: list[Any] = [None] * len(tasks)

    def play(i: int) -> None:
        task = tasks[i]
        given = dict(rows[task.row_index]) if rows is not None and task.row_index is not None else {"seed": task.seed}
        key = api_key or secret_from_env("OPENAI_API_KEY") or ""
        outcomes[i] = runner.run(given, base_url, key, f"eval-{uuid.uuid4().hex[:8]}", spec.episode_timeout_s, cancel)

    threads = [threading.Thread(target=play, args=(i,), daemon=True) for i in range(len(tasks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out = []
    for task, outcome in zip(tasks, outcomes):
        reward = outcome.reward if outcome.failure is None else spec.failure_score
        if outcome.failure is None and reward is None:
            outcome.failure = "no reward (rubrics score recorded conversations: evaluate a local model for them)"
            reward = spec.failure_score
        traj = Trajectory(seed=task.seed, row_index=task.row_index, rewards=[] if reward is None else [float(reward)],
                          info={"agent_failure": outcome.failure} if outcome.failure else {})
        if reward is None:
            traj.error = f"agent: {outcome.failure}"
        elif outcome.components:
            traj.info["reward_components"] = dict(outcome.components)
        out.append(traj)
    return out
