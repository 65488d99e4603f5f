"""Evaluating a policy on an env without training: what ``agilerl eval`` does, callable from Python.

Every (task, sample) pair is one episode. Episodes run ``concurrency`` at a time on a
``RolloutCollector`` (one batched generate call per turn, all envs stepped at once); each
finished episode is one JSON line in the results file, transcript included, written as its batch
ends, so an interrupted run resumes where it stopped. The summary is computed from the file:
mean and std of the episode reward, accuracy (``mean / max_reward``) and pass@k.

    summary = evaluate_policy(spec, policy, tokenizer, EvalPlan(output=Path("eval.jsonl"), samples=4))
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agilerl.envs.client import WrappingClient, as_client
from agilerl.errors import InvalidArgument
from agilerl.images import ImageObservation
from agilerl.assembly.env_factory import first_then, make_env_factory
from agilerl.assembly.from_spec import tool_kwargs
from agilerl.manifest.environment import AgentSpec, EnvironmentSpec, RolloutSpec
from agilerl.protocol import EnvInfo, StepResult
from agilerl.rollout.assigner import Task, refuse_too_many_rows
from agilerl.rollout.collector import RolloutCollector
from agilerl.generation.policy import Policy, SamplingParams
from agilerl.rollout.trajectory import Trajectory
from agilerl.generation.versioned import VersionedPolicy
from agilerl.tools.metrics import TOOL_STATS_KEY, tool_call_metrics
from agilerl.train.metrics import LineSchedule, ProgressBar, judge_metrics, reward_component_metrics

__all__ = ["EvalPlan", "EvalSummary", "pass_at_k", "evaluate_spec", "ResultsFile"]

_EPISODE_KEY = "agilerl_eval_episode"
"""Put in each reset's info (a copy), so a trajectory leads back to the transcript its env recorded."""


@dataclass(frozen=True)
class EvalPlan:
    """What to play: ``num_tasks`` tasks (None: the env's held-out split, else 8), ``samples``
    episodes each (the k of pass@k), ``concurrency`` episodes at a time."""

    output: Path
    num_tasks: int | None = None
    samples: int = 1
    concurrency: int = 16
    seed: int = 0
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    max_reward: float | None = None
    pass_threshold: float | None = None
    resume: bool = False
    label: dict[str, Any] = field(default_factory=dict)
    """Who was evaluated on what (model, backend, env); on every row, checked on resume."""

    def __post_init__(self) -> None:
        for name in ("samples", "concurrency"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_tasks is not None and self.num_tasks < 1:
            raise InvalidArgument(f"num_tasks must be >= 1, got {self.num_tasks}")


@dataclass
class EvalSummary:
    """The run's numbers, over every row of the results file (resumed ones too)."""

    episodes: int
    failures: int
    tasks: int
    samples: int
    reward_mean: float | None
    reward_std: float | None
    accuracy: float | None
    pass_at_k: dict[int, float]
    turns_mean: float | None
    output: str
    played: int
    resumed: int
    reward_components: dict[str, float] = field(default_factory=dict)
    """``reward/<name>``: each reward component's mean over the finished episodes."""
    judge: dict[str, float] = field(default_factory=dict)
    """``judge/...`` over this run's judge calls, when a judge scored."""
    tools: dict[str, float] = field(default_factory=dict)
    """``tools/...`` (calls per episode, the well-formed share, failures by status), with a tool parser."""

    def as_dict(self) -> dict[str, Any]:
        data = dict(vars(self))
        data["pass_at_k"] = {f"pass@{k}": v for k, v in self.pass_at_k.items()}
        return data


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from ``n`` samples of which ``c`` passed: the chance that
    ``k`` of them, drawn without replacement, hold at least one pass (Chen et al., 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise InvalidArgument(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def evaluate_spec(
    spec: EnvironmentSpec,
    policy: Policy,
    tokenizer: Any,
    plan: EvalPlan,
    *,
    base_dir: str | Path | None = None,
    show_progress: bool = False,
) -> EvalSummary:
    """Play ``plan`` on the env ``spec`` names with ``policy`` and write the results file."""
    if isinstance(spec, AgentSpec):  # an agent program plays against the served policy
        from agilerl.assembly.agents import evaluate_agents

        return evaluate_agents(spec, policy, tokenizer, plan, base_dir=base_dir)  # type: ignore[no-any-return]
    if not isinstance(spec, RolloutSpec):
        raise InvalidArgument(
            "environment.env_type 'dataset' is training data (SFT/preference), not an env to "
            "evaluate on: use env_type 'rollout' (a dataset with a rubric, an entrypoint or env_url)"
        )
    inner = make_env_factory(spec, base_dir=base_dir)
    first = _Recorded(inner())
    try:
        info = first.describe()
        held_out = info.eval_dataset_size
        slots = _slots_admitted(info, plan.concurrency)
        max_reward = plan.max_reward if plan.max_reward is not None else spec.max_reward
        if max_reward is None:
            max_reward = info.max_reward
        max_turns = info.turn_budget(spec.max_turns)  # fails here, before a results file is opened
        num_tasks = plan.num_tasks or held_out or 8
        if held_out is not None:
            num_tasks = min(num_tasks, held_out)
        # a server may claim any eval_dataset_size: training's bound on rows, before the episodes are listed
        what = "num_tasks" if plan.num_tasks else "the env's eval_dataset_size"
        refuse_too_many_rows(
            what if plan.samples == 1 else f"{what} x samples", num_tasks * plan.samples,
            "pass --num-tasks N (-n) to play the first N tasks",
        )
    except BaseException:
        first.close()
        raise
    episodes = [(t, s) for t in range(num_tasks) for s in range(plan.samples)]
    results = ResultsFile(plan.output, plan.label, resume=plan.resume)
    todo = [e for e in episodes if e not in results.rows]
    resumed = len(episodes) - len(todo)
    if todo:
        # one set of weights: every generated token is version 0 (the field training's trajectories carry)
        versioned = policy if isinstance(policy, VersionedPolicy) else VersionedPolicy(policy)
        recorded_envs = first_then(first, lambda: _Recorded(inner()))  # the one already built first
        with RolloutCollector(
            recorded_envs, tokenizer, batch_size=min(slots, len(todo)), group_size=1,
            max_turns=max_turns, sampling=plan.sampling, seed=plan.seed, max_reward=max_reward,
            chat_template_kwargs=spec.chat_template_kwargs, env_timeout_s=spec.request_timeout_s or None,
            context_policy=spec.context_policy,
            **tool_kwargs(spec, base_dir),
        ) as collector, _progress(show_progress, len(episodes), resumed) as advance:
            for start in range(0, len(todo), collector.num_slots):
                chunk = todo[start : start + collector.num_slots]
                tasks = [Task(plan.seed + t, t if held_out is not None else None) for t, _ in chunk]
                batch = collector.play(tasks, versioned, evaluation=True if held_out is not None else None)
                results.extend(_row(t, s, traj, max_reward, plan) for (t, s), traj in zip(chunk, batch.trajectories))
                advance(len(chunk))
    else:
        first.close()
    return _summary(results, episodes, plan, max_reward, played=len(todo), resumed=resumed)


def _slots_admitted(info: EnvInfo, concurrency: int) -> int:
    """``concurrency``, lowered to what a remote server admits (the collector holds one session
    per slot plus one for its own evaluation)."""
    limit = info.max_concurrent_envs
    if limit is None:
        return concurrency
    if limit < 2:
        raise InvalidArgument(
            f"the env server admits {limit} concurrent session(s); evaluation needs 2: start it "
            "with agilerl serve ... --max-concurrent-envs 2 or more"
        )
    return min(concurrency, limit - 1)


def _row(task: int, sample: int, traj: Trajectory, max_reward: float | None, plan: EvalPlan) -> dict[str, Any]:
    info = dict(traj.info)
    transcript: _Transcript | None = info.pop(_EPISODE_KEY, None)
    threshold = plan.pass_threshold if plan.pass_threshold is not None else max_reward
    reward = traj.total_reward
    return {
        **plan.label,
        "task": task,
        "sample": sample,
        "seed": traj.seed,
        "row_index": traj.row_index,
        "reward": reward,
        "passed": None if threshold is None or traj.error else reward >= threshold,
        "turns": traj.num_turns,
        "rewards": traj.rewards,
        "versions": _generated(traj.versions, traj.action_mask),
        "terminated": traj.terminated,
        "truncated": traj.truncated,
        "truncated_by": traj.info.get("truncated_by"),
        "reward_components": info.pop("reward_components", {}),
        "error": traj.error,
        "messages": transcript.messages if transcript else [],
        "info": info,
    }


def _generated(versions: list[int] | None, mask: list[bool]) -> list[int] | None:
    """The policy version of each generated token, in order (None when the policy reports none)."""
    return None if versions is None else [v for v, generated in zip(versions, mask) if generated]


def _summary(
    results: ResultsFile, episodes: list[tuple[int, int]], plan: EvalPlan, max_reward: float | None,
    *, played: int, resumed: int,
) -> EvalSummary:
    rows = [results.rows[e] for e in episodes if e in results.rows]
    good = [r for r in rows if r["error"] is None]
    rewards = [float(r["reward"]) for r in good]
    mean = statistics.fmean(rewards) if rewards else None
    passes: dict[int, list[bool]] = {}
    for r in good:
        if r["passed"] is not None:
            passes.setdefault(r["task"], []).append(bool(r["passed"]))
    ks = sorted({k for k in (1, 2, 4, 8, 16, 32, 64, 128, plan.samples) if k <= plan.samples})
    pass_at = {}
    for k in ks:
        scores = [pass_at_k(len(p), sum(p), k) for p in passes.values() if len(p) >= k]
        if scores:
            pass_at[k] = statistics.fmean(scores)
    return EvalSummary(
        episodes=len(good),
        failures=len(rows) - len(good),
        tasks=len({r["task"] for r in rows}),
        samples=plan.samples,
        reward_mean=mean,
        reward_std=statistics.pstdev(rewards) if rewards else None,
        accuracy=mean / max_reward if mean is not None and max_reward else None,
        pass_at_k=pass_at,
        turns_mean=statistics.fmean(r["turns"] for r in good) if good else None,
        output=str(results.path),
        played=played,
        resumed=resumed,
        reward_components=reward_component_metrics(r.get("reward_components") for r in good),
        judge=judge_metrics(),
        tools=tool_call_metrics((r.get("info") or {}).get(TOOL_STATS_KEY) for r in good),
    )


class ResultsFile:
    """The JSONL results: one row per finished episode, appended (and fsynced) as batches end.

    On resume, rows whose episode ended without an env error are kept (the label must match) and
    the rest are played again; a torn last line (the run was killed mid-write) is dropped. The
    file is rewritten with the kept rows first, so it never holds two rows for one episode.
    """

    def __init__(self, path: Path, label: dict[str, Any], *, resume: bool) -> None:
        self.path = path
        self.rows: dict[tuple[int, int], dict[str, Any]] = {}
        if path.exists() and path.stat().st_size and not resume:
            raise InvalidArgument(
                f"results file {path} already holds rows: continue it with --resume, or pick "
                "another --output (or delete the file)"
            )
        if resume and path.exists():
            self._load(label)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w") as out:
            out.writelines(_line(row) for row in self.rows.values())
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)  # all kept rows or none: a kill here leaves the old file whole

    def _load(self, label: dict[str, Any]) -> None:
        lines = self.path.read_bytes().split(b"\n")  # decoded line by line: one bad byte spoils one line
        while lines and not lines[-1].strip():
            lines.pop()
        for number, data in enumerate(lines, 1):
            if not data.strip():
                continue
            try:
                row = json.loads(data.decode("utf-8"))  # UnicodeDecodeError is a ValueError
                key = (int(row["task"]), int(row["sample"]))
            except (ValueError, KeyError, TypeError):
                shown = data[:80].decode("utf-8", "replace")
                if number == len(lines):  # torn or corrupted by a kill mid-write: played again
                    print(
                        f"warning: results file {self.path}: dropped its damaged last line ({shown!r}); "
                        "the episode it held is played again", file=sys.stderr, flush=True,
                    )
                    break
                raise InvalidArgument(
                    f"results file {self.path}, line {number}: not an eval row ({shown!r}); "
                    "resume only a file agilerl eval wrote, or pick another --output"
                ) from None
            other = {k: row.get(k) for k in label if row.get(k) != label[k]}
            if other:
                raise InvalidArgument(
                    f"results file {self.path} holds a run with {other}, but this run has "
                    f"{ {k: label[k] for k in other} }: resume with the same model and env, or "
                    "pick another --output"
                )
            if row.get("error") is None:
                self.rows[key] = row

    def extend(self, rows: Iterable[dict[str, Any]]) -> None:
        """Append a batch's rows in one write, on disk before the next batch starts."""
        rows = list(rows)
        with self.path.open("a") as out:
            out.write("".join(_line(row) for row in rows))
            out.flush()
            os.fsync(out.fileno())
        self.rows.update(((row["task"], row["sample"]), row) for row in rows)


def _line(row: dict[str, Any]) -> str:
    return json.dumps(row, default=repr) + "\n"


@contextmanager
def _progress(show: bool, total: int, done: int) -> Iterator[Callable[[int], None]]:
    """A progress bar over episodes (on stderr), or nothing. Where stderr is no terminal (a log
    file, a pipe), plain lines at intervals instead: rich would squeeze the bar to one cut line."""
    if not show:
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    if not console.is_terminal:  # rich's test: TTY_COMPATIBLE and FORCE_COLOR, else isatty
        schedule, shown = LineSchedule(total, done, ProgressBar), [done]

        def advance(n: int) -> None:
            shown[0] += n
            if schedule.due(shown[0]):
                print(f"eval {shown[0]}/{total} episodes  {schedule.times(shown[0])}", file=sys.stderr, flush=True)

        yield advance
        return
    columns = (TextColumn("eval"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("eval", total=total, completed=done)
        yield lambda n: bar.advance(task, n)


class _Transcript:
    """The conversation one episode's env saw, as messages (an image as ``[image WxH]``)."""

    def __init__(self, system_prompt: str | None, prompt: str, info: dict[str, Any]) -> None:
        opening = info.get("messages")
        if not opening:
            opening = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
                {"role": "user", "content": _shown(prompt)}
            ]
        self.messages: list[dict[str, Any]] = list(opening)

    def add(self, action: str, result: StepResult) -> None:
        self.messages.append({"role": "assistant", "content": action})
        observation, _, terminated, truncated, _ = result
        if observation or not (terminated or truncated):  # an empty last word is no message
            self.messages.append({"role": "user", "content": _shown(observation)})


def _shown(observation: Any) -> Any:
    """An observation as a results row holds it: text, or an image observation's transcript."""
    return observation.transcript() if isinstance(observation, ImageObservation) else observation


class _Recorded(WrappingClient):
    """An env client that records each episode's messages and tags its reset info with them."""

    def __init__(self, env: Any) -> None:
        super().__init__(as_client(env))
        self._transcript: _Transcript | None = None

    def reset(self, seed: int | None = None, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        return self._opened(self.inner.reset(seed, **kwargs))

    async def areset(self, seed: int | None = None, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        return self._opened(await self.inner.areset(seed, **kwargs))

    def step(self, action: str) -> StepResult:
        return self._stepped(action, self.inner.step(action))

    async def astep(self, action: str) -> StepResult:
        return self._stepped(action, await self.inner.astep(action))

    def call_tool(self, name: str, arguments: dict[str, Any]) -> StepResult:
        return self._called(name, arguments, self.inner.call_tool(name, arguments))

    async def acall_tool(self, name: str, arguments: dict[str, Any]) -> StepResult:
        return self._called(name, arguments, await self.inner.acall_tool(name, arguments))

    def _opened(self, result: tuple[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        prompt, info = result
        self._transcript = _Transcript(self.inner.describe().system_prompt, prompt, info)
        return prompt, {**info, _EPISODE_KEY: self._transcript}

    def _called(self, name: str, arguments: dict[str, Any], result: StepResult) -> StepResult:
        if self._transcript is not None:
            call = {"type": "function", "function": {"name": name, "arguments": arguments}}
            self._transcript.messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            self._transcript.messages.append({"role": "tool", "name": name, "content": result[0]})
        return result

    def _stepped(self, action: str, result: StepResult) -> StepResult:
        if self._transcript is not None:
            self._transcript.add(action, result)
        return result

