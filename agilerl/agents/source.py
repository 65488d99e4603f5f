"""AgentCollector: agent programs as a rollout source, with the collector's interface.

Each slot plays one whole episode: the agent (a program or a function) runs against the
endpoint with its episode's key, off the trainer's threads, and the episode's calls become its
samples (``agilerl.agents.episodes``). Every slot of a batch (or of the async pipeline's group)
runs at once, so their calls meet in the policy's batch. Tasks are dealt as for any env: a
dataset's rows (a group shares its row) or seeds.

A failed episode (the program exits non-zero, prints no reward, outlives ``episode_timeout_s``,
or the function raises) costs only itself: it scores ``failure_score`` (None: it is lost, as a
failed judge's sample is), is counted in ``agent/failures``, and its stderr tail is logged once.
When every episode has failed for ``give_up_after_s``, the run stops with a ``CollectionError``
naming the command and its stderr.

    collector = AgentCollector(CommandAgent(["python", "agent.py"]), tokenizer, batch_size=4, group_size=4)
    batch = collector.collect(policy)   # a RolloutBatch: one Trajectory per episode, samples within
"""

from __future__ import annotations

import itertools
import logging
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from agilerl.agents.endpoint import AgentEndpoint
from agilerl.agents.episodes import Episode
from agilerl.agents.metrics import AGENT_STATS_KEY
from agilerl.agents.programs import AgentOutcome, AgentRunner
from agilerl.concurrency import WorkerThreads
from agilerl.errors import InvalidArgument
from agilerl.generation.policy import Policy, SamplingParams
from agilerl.rollout.assigner import Task, TaskAssigner
from agilerl.rollout.results import CollectionError, EvalResult, RolloutBatch, Run, evaluation_episodes
from agilerl.rollout.trajectory import Trajectory

__all__ = ["AgentCollector"]

log = logging.getLogger(__name__)

class _AgentFailed(Exception):
    """An agent episode lost (``failure_score: null``, or no call to train on)."""


class AgentCollector:
    """Plays agent episodes, ``batch_size`` tasks x ``group_size`` at a time (see the module doc).

    ``train_rows``/``eval_rows``: the dataset's rows (each episode's task is its row); None: tasks
    are ``{"seed": s}``. ``rubric`` (an ``agilerl.data.rubric.Rubric``) scores the final
    conversation of an episode whose agent reports no reward.
    """

    episode_retries = 0

    def __init__(
        self,
        agent: AgentRunner,
        tokenizer: Any,
        *,
        batch_size: int,
        group_size: int,
        sampling: SamplingParams | None = None,
        seed: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        train_rows: Sequence[Any] | None = None,
        eval_rows: Sequence[Any] | None = None,
        rubric: Any = None,
        max_reward: float | None = None,
        max_turns: int | None = None,
        episode_timeout_s: float = 600.0,
        failure_score: float | None = 0.0,
        give_up_after_s: float = 300.0,
        tool_parser: Any = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        max_request_bytes: int = 8 * 1024 * 1024,
        max_concurrent_calls: int = 8,
        model_name: str = "agilerl-policy",
    ) -> None:
        if batch_size < 1 or group_size < 1:
            raise InvalidArgument(f"batch_size and group_size must be >= 1, got {batch_size} and {group_size}")
        if episode_timeout_s <= 0 or give_up_after_s <= 0:
            raise InvalidArgument(
                f"episode_timeout_s and give_up_after_s must be > 0, got {episode_timeout_s} and {give_up_after_s}"
            )
        self.agent = agent
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.group_size = group_size
        self.num_slots = batch_size * group_size
        self.max_turns = max_turns
        self.max_reward = max_reward
        self.env_timeout_s: float | None = episode_timeout_s  # the pipeline's stall bound reads it
        self.episode_timeout_s = episode_timeout_s
        self.failure_score = failure_score
        self.give_up_after_s = give_up_after_s
        self.rubric = rubric
        self.train_rows, self.eval_rows = train_rows, eval_rows
        self.assigner = TaskAssigner(
            len(train_rows) if train_rows is not None else None, seed=seed, rank=rank, world_size=world_size
        )
        self.endpoint = AgentEndpoint(
            tokenizer, model_name=model_name, tool_parser=tool_parser, chat_template_kwargs=chat_template_kwargs,
            max_request_bytes=max_request_bytes, max_concurrent_calls=max_concurrent_calls,
        )
        base = sampling or SamplingParams()
        stops = [self.endpoint.renderer.end_of_turn_id, tokenizer.eos_token_id, *base.stop_token_ids]
        self.sampling = replace(base, stop_token_ids=tuple(dict.fromkeys(s for s in stops if s is not None)))
        self._threads = WorkerThreads("agilerl-agent")
        self._episode_ids = itertools.count()
        self._run_id = uuid.uuid4().hex[:8]
        self._failing_since: float | None = None
        self._logged: set[tuple[str, str]] = set()
        self._live: set[threading.Event] = set()  # the cancel events of plays under way
        self._closed = False

    # -- the collector's interface ----------------------------------------------------------------

    def collect(self, policy: Policy) -> RolloutBatch:
        """Play one batch: ``batch_size`` tasks, each by a group of ``group_size`` episodes."""
        start = time.perf_counter()
        tasks = self.assigner.assign(self.batch_size, self.group_size)
        run = self._play(dict(enumerate(tasks)), policy, self.sampling)
        return run.batch(time.perf_counter() - start, min_finished=min(2, self.group_size))

    def skip(self, batches: int) -> None:
        """Pass over the tasks of the next ``batches`` collections (a resumed run)."""
        for _ in range(batches):
            self.assigner.assign(self.batch_size, self.group_size)

    def play(self, tasks: Sequence[Task], policy: Policy, *, evaluation: bool | None = None) -> RolloutBatch:
        """Play chosen tasks at once, slot ``i`` playing ``tasks[i]``."""
        if not tasks:
            raise InvalidArgument("play takes at least one task")
        start = time.perf_counter()
        run = self._play(dict(enumerate(tasks)), policy, self.sampling, evaluation)
        return run.batch(time.perf_counter() - start)

    def play_group(self, group: int, task: Task, policy: Policy, *, stop: Callable[[Run], bool] | None = None) -> Run:
        """Play one group of ``task`` (the async pipeline's lanes, each on its own thread)."""
        slots = range(group * self.group_size, (group + 1) * self.group_size)
        return self._play(dict.fromkeys(slots, task), policy, self.sampling, stop=stop)

    def add_groups(self, count: int) -> None:
        """More groups in flight (the async pipeline): agents need no env built ahead."""
        self.num_slots += max(0, count) * self.group_size

    def evaluate(self, policy: Policy, *, num_episodes: int | None = None) -> EvalResult:
        """Greedy episodes at once: the held-out rows (all, or the first ``num_episodes``), else
        seeds ``0 .. num_episodes-1``."""
        held_out = len(self.eval_rows) if self.eval_rows is not None else None
        num_episodes = evaluation_episodes(held_out, num_episodes, "these agent tasks")
        tasks = {i: Task(i, i if held_out is not None else None) for i in range(num_episodes)}
        greedy = replace(self.sampling, temperature=0.0)
        run = self._play(tasks, policy, greedy, evaluation=True if held_out is not None else None)
        rewards = [t.total_reward for t in run.trajectories.values() if t.error is None]
        failures = num_episodes - len(rewards)
        if not rewards:
            raise CollectionError(f"every one of the {num_episodes} evaluation episodes failed; the first, {run.first_loss()}")
        mean = statistics.fmean(rewards)
        return EvalResult(mean, mean / self.max_reward if self.max_reward else None, len(rewards), failures)

    def close(self) -> None:
        """End any agent still running (its process group killed) and stop the endpoint (idempotent)."""
        if not self._closed:
            self._closed = True
            for cancel in tuple(self._live):
                cancel.set()
            self.endpoint.close()
            self._threads.shutdown()

    def __enter__(self) -> AgentCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- playing ----------------------------------------------------------------------------------

    def task_of(self, task: Task, evaluation: bool | None) -> Any:
        """What an agent gets as its task: the dataset row, else ``{"seed": s}``."""
        rows = self.eval_rows if evaluation else self.train_rows
        if rows is None or task.row_index is None:
            return {"seed": task.seed}
        return dict(rows[task.row_index])

    def _play(
        self, tasks: dict[int, Task], policy: Policy, params: SamplingParams, evaluation: bool | None = None,
        *, stop: Callable[[Run], bool] | None = None,
    ) -> Run:
        """Run every slot's episode at once to its end; record each as a finished or lost rollout."""
        if self._closed:
            raise CollectionError("the collector is closed")
        run = Run(tasks, self.group_size)
        cancel = threading.Event()
        results: dict[int, tuple[Episode, AgentOutcome]] = {}
        done = threading.Condition()

        def play(slot: int) -> None:
            task = tasks[slot]
            episode = self.endpoint.open_episode(
                f"{self._run_id}-{next(self._episode_ids)}", policy, params, max_calls=self.max_turns
            )
            try:
                outcome = self.agent.run(
                    self.task_of(task, evaluation), self.endpoint.base_url, episode.key, episode.id,
                    self.episode_timeout_s, cancel,
                )
            except Exception as exc:  # noqa: BLE001 - a runner's own error is its episode's failure
                outcome = AgentOutcome(failure=f"{type(exc).__name__}: {exc}")
            finally:
                self.endpoint.close_episode(episode)
            with done:
                results[slot] = (episode, outcome)
                done.notify_all()

        t0, started = time.perf_counter(), time.monotonic()
        self._live.add(cancel)
        try:
            for slot in tasks:
                self._threads.submit(lambda slot=slot: play(slot))
            with done:
                while len(results) < len(tasks):
                    done.wait(0.1)
                    if stop is not None and not cancel.is_set() and stop(run):
                        cancel.set()  # the agents end now; the run is discarded by the caller
        except BaseException:  # Ctrl-C: no program outlives the play
            cancel.set()
            with done:
                done.wait_for(lambda: len(results) == len(tasks), timeout=10)
            raise
        finally:
            self._live.discard(cancel)
        run.env_time_s = time.perf_counter() - t0
        error, self.endpoint.generation_error = self.endpoint.generation_error, None
        if error is not None:  # the model, not the programs: the run stops naming it
            raise CollectionError(f"generating for the agent programs failed: {type(error).__name__}: {error}") from error
        for slot in sorted(results):
            episode, outcome = results[slot]
            self._record(run, slot, tasks[slot], evaluation, episode, outcome)
        if cancel.is_set():
            return run
        self._check_giving_up(results, started)
        return run

    def _record(
        self, run: Run, slot: int, task: Task, evaluation: bool | None, episode: Episode, outcome: AgentOutcome
    ) -> None:
        """One episode into the run: its samples with their reward, or a loss."""
        run.generation_calls += episode.calls
        run.generation_time_s += episode.call_s
        run.generated_tokens += episode.generated_tokens
        samples = episode.trajectories()
        if outcome.failure is None and outcome.reward is None:
            outcome = self._score_conversation(task, evaluation, episode, outcome)
        failed = outcome.failure is not None
        if failed:
            self._log_failure(episode, outcome)
        reward = self.failure_score if failed else outcome.reward
        stats = {"calls": episode.calls, "samples": len(samples), "failed": int(failed), "call_s": episode.call_s}
        if reward is None or not samples:
            why = outcome.failure if failed else "the agent made no model call"
            traj = Trajectory(seed=task.seed, row_index=task.row_index, episode=episode.id, info={AGENT_STATS_KEY: stats})
            run.trajectories[slot] = traj
            run.fail(slot, "agent", _AgentFailed(why or "failed"), traj)
            return
        last = samples[-1]
        last.prior_samples = samples[:-1]
        last.rewards = [0.0] * (episode.turns - 1) + [float(reward)]
        last.seed, last.row_index = task.seed, task.row_index
        last.terminated = True
        last.info[AGENT_STATS_KEY] = stats
        if failed:
            last.info["agent_failure"] = outcome.failure
        elif outcome.components:
            last.info["reward_components"] = dict(outcome.components)
        if run.oldest_version is None and last.versions:
            run.oldest_version = min((v for s in samples for v in (s.versions or []) if v >= 0), default=None)
        run.finish(slot, last)

    def _score_conversation(self, task: Task, evaluation: bool | None, episode: Episode, outcome: AgentOutcome) -> AgentOutcome:
        """No reward from the agent: the rubric scores the final conversation (else a failure)."""
        if self.rubric is None:
            return replace(outcome, failure="no reward line (the last stdout line must be {\"reward\": r}) and no rubrics")
        conversation = episode.last_chat or []
        completion = conversation[-1]["content"] if conversation else ""
        row = self.task_of(task, evaluation)
        info = {"messages": conversation, "episode": episode.id}
        try:
            reward, components = self.rubric.score(completion, row, info, f"episode {episode.id}")
        except Exception as exc:  # noqa: BLE001 - a rubric error costs its episode only
            return replace(outcome, failure=f"rubric: {exc}")
        return replace(outcome, reward=reward, components=components)

    def _log_failure(self, episode: Episode, outcome: AgentOutcome) -> None:
        """The stderr tail of a failure, logged once per distinct failure."""
        key = (outcome.failure or "", outcome.stderr_tail)
        if key in self._logged:
            return
        self._logged.add(key)
        log.warning(
            "agent episode %s failed (%s): %s\n--- stderr tail ---\n%s",
            episode.id, self.agent.what, outcome.failure, outcome.stderr_tail or "(empty)",
        )

    def _check_giving_up(self, results: dict[int, tuple[Episode, AgentOutcome]], started: float) -> None:
        """Stop the run once every episode has failed for ``give_up_after_s`` (since the start of
        the first play in which all failed)."""
        outcomes = [o for _, o in results.values()]
        now = time.monotonic()
        if any(o.failure is None for o in outcomes):
            self._failing_since = None
            return
        if self._failing_since is None:
            self._failing_since = started
        if now - self._failing_since >= self.give_up_after_s:
            last = outcomes[-1]
            raise CollectionError(
                f"every agent episode has failed for {now - self._failing_since:.0f} s (give_up_after_s "
                f"{self.give_up_after_s:g}): the command {self.agent.what!r} ends with {last.failure}; its "
                f"stderr ends:\n{last.stderr_tail or '(empty)'}"
            )

