"""RolloutCollector: batches of grouped multi-turn rollouts, with the model and the envs kept busy.

``batch_size * group_size`` slots each own one env (a ``RolloutHarness``), built once and reused
until ``close()`` (``agilerl.rollout.slots``: building, dropping, closing). Every turn makes ONE batched ``policy.generate`` call for all live
slots, then steps all their envs at once through the clients' async methods (``areset``/``astep``)
on the shared event loop. A batch of 64 rollouts against a 50 ms env thus costs about
``turns x 50 ms`` of env time, not ``64 x turns x 50 ms``.

Hand-tuned fast path: blocking in-process envs skip the event loop; their sync methods run on
worker threads, one per slot, with one latch per phase (``run_in_threads``). Set
``RolloutCollector.threads_for_blocking_envs = False`` to drive them through ``areset``/``astep``
like remote envs (the A/B baseline in bench/collector.py).

A slot whose env raises, or whose remote session drops, plays its task again from ``reset`` on
a fresh env (up to ``episode_retries`` times; a remote client reconnects through an outage of
up to its ``retry_budget_s``). A rollout still failing, or past ``env_timeout_s``, keeps its
place in its group with ``error`` set (the training batch marks it invalid); a group left with
fewer than two finished rollouts is dropped. Text the model's context cannot hold ends its
episode before it is tokenized (``agilerl.rollout.context``). See docs/collector.md.

    collector = RolloutCollector(factory, tokenizer, batch_size=8, group_size=4, max_turns=3)
    batch = collector.collect(TransformersPolicy(model, tokenizer))
    batch.groups        # 8 lists of 4 trajectories, each group on one task
    batch.stats.metrics()
    collector.evaluate(policy)   # greedy, over the held-out split
    collector.close()
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agilerl.chat import ChatRenderer
from agilerl.concurrency import run_in_threads, run_on_loop, shared_loop
from agilerl.errors import EnvUnavailable, InvalidArgument
from agilerl.tools import resolve_tool_parser
from agilerl.rollout.assigner import Task, TaskAssigner
from agilerl.rollout.context import ContextBudget, answer_chars
from agilerl.rollout.context_policy import ContextPolicy, room_for, target_for
from agilerl.rollout.slots import EnvSlots
from agilerl.rollout.tool_routing import late_call
from agilerl.generation.policy import Generation, Policy, SamplingParams
from agilerl.rollout.results import (
    ENV_CHECK_HINT,
    CollectionError,
    EvalResult,
    RolloutBatch,
    Run,
    end_of_last_action,
    evaluation_episodes,
)

if TYPE_CHECKING:
    from agilerl.manifest.spec import EnvironmentSpec

__all__ = ["RolloutCollector"]

log = logging.getLogger(__name__)


class RolloutCollector:
    """Runs ``batch_size`` tasks x ``group_size`` rollouts per ``collect`` (see the module doc)."""

    threads_for_blocking_envs: bool = True
    """The hand-tuned fast path (see the module doc); False drives every env through its async methods."""

    def __init__(
        self,
        env_factory: Callable[[], Any],
        tokenizer: Any,
        *,
        batch_size: int,
        group_size: int,
        max_turns: int | None = None,
        sampling: SamplingParams | None = None,
        env_timeout_s: float | None = 300.0,
        seed: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        max_reward: float | None = None,
        system_prompt: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        episode_retries: int = 2,
        max_model_len: int | None = None,
        tool_parser: Any = None,
        send_reasoning: bool = False,
        context_policy: ContextPolicy = "error",
    ) -> None:
        if batch_size < 1 or group_size < 1:
            raise InvalidArgument(f"batch_size and group_size must be >= 1, got {batch_size} and {group_size}")
        self.batch_size = batch_size
        self.group_size = group_size
        self.env_timeout_s = env_timeout_s
        self.episode_retries = episode_retries
        self.max_model_len = max_model_len
        self.tokenizer = tokenizer
        self._context: ContextBudget | None = None
        self.context_policy = context_policy
        """What an episode does when its conversation outgrows the context (``agilerl.rollout.context_policy``)."""
        # one parser for every slot (``tool_parser``: see RolloutHarness); None: text steps
        tools = {} if tool_parser is None else {
            "tool_parser": resolve_tool_parser(tool_parser, tokenizer), "send_reasoning": send_reasoning
        }
        self._apply_lock = threading.Lock()
        self._closed = False
        self._envs = EnvSlots(
            env_factory, tokenizer, batch_size * group_size, max_turns=max_turns, system_prompt=system_prompt,
            chat_template_kwargs=chat_template_kwargs, context_policy=context_policy, **tools,
        )
        self.max_turns = self._envs.max_turns
        info = self._envs.info
        try:
            self.assigner = TaskAssigner(info.dataset_size, seed=seed, rank=rank, world_size=world_size)
        except BaseException:
            self._envs.close()
            raise
        client = self._envs[0].client
        self._threaded = self.threads_for_blocking_envs and client.blocking
        # a remote reset may spend this long reconnecting (an outage) before it even sends
        self._reconnect_s = client.retry_budget_s
        self.max_reward = max_reward if max_reward is not None else info.max_reward
        base = sampling or SamplingParams()
        stops = [self._envs[0].renderer.end_of_turn_id, tokenizer.eos_token_id, *base.stop_token_ids]
        self.sampling = replace(base, stop_token_ids=tuple(dict.fromkeys(s for s in stops if s is not None)))

    @classmethod
    def from_spec(
        cls,
        spec: EnvironmentSpec,
        tokenizer: Any,
        *,
        batch_size: int,
        group_size: int,
        base_dir: str | Path | None = None,
        **kwargs: Any,
    ) -> RolloutCollector:
        """A collector over the envs a manifest's ``environment:`` section describes (the mapping
        lives in ``agilerl.assembly.from_spec``); ``first_env=``, an env of that spec already
        built, becomes the first slot's."""
        from agilerl.assembly.from_spec import collector_from_spec  # the door: see [tool.importlinter]

        return collector_from_spec(
            cls, spec, tokenizer, batch_size=batch_size, group_size=group_size, base_dir=base_dir, **kwargs
        )

    @property
    def num_slots(self) -> int:
        """Rollout slots (``batch_size x group_size``, more after ``add_groups``), one env each."""
        return self._envs.count

    # -- collection ---------------------------------------------------------------------------

    def collect(self, policy: Policy) -> RolloutBatch:
        """Play one batch to the end of every episode; groups left with fewer than two finished
        rollouts are dropped (see "When an env fails" in docs/collector.md)."""
        start = time.perf_counter()
        tasks = self.assigner.assign(self.batch_size, self.group_size)
        run = self._play(dict(enumerate(tasks)), policy, self.sampling)
        return run.batch(time.perf_counter() - start, min_finished=min(2, self.group_size))

    def skip(self, batches: int) -> None:
        """Pass over the tasks of the next ``batches`` ``collect`` calls without playing them, so
        a resumed run continues the task stream where its checkpoint left it."""
        for _ in range(batches):
            self.assigner.assign(self.batch_size, self.group_size)

    def play(self, tasks: Sequence[Task], policy: Policy, *, evaluation: bool | None = None) -> RolloutBatch:
        """Play chosen tasks at once, slot ``i`` playing ``tasks[i]`` (at most ``batch_size x
        group_size``; group ``g`` is slots ``g*G .. g*G+G-1``), with the collector's sampling.
        ``agilerl eval`` uses it; training draws its tasks through ``collect``."""
        if not 0 < len(tasks) <= self.num_slots:
            raise InvalidArgument(f"play takes 1 to {self.num_slots} tasks (one per slot), got {len(tasks)}")
        start = time.perf_counter()
        run = self._play(dict(enumerate(tasks)), policy, self.sampling, evaluation)
        return run.batch(time.perf_counter() - start)

    def play_group(
        self, group: int, task: Task, policy: Policy, *, stop: Callable[[Run], bool] | None = None
    ) -> Run:
        """Play one group: ``task`` on every slot of slot-group ``group`` (slots ``group*G ..
        group*G+G-1``), with the collector's sampling. Several threads may each play their own
        group at once (the async pipeline's lanes, docs/async.md); ``stop(run)``, asked before every
        turn, ends the play early (the run is then incomplete and discarded by the caller)."""
        if not 0 <= group < self.num_slots // self.group_size:
            raise InvalidArgument(f"group must be in 0..{self.num_slots // self.group_size - 1}, got {group}")
        slots = range(group * self.group_size, (group + 1) * self.group_size)
        return self._play(dict.fromkeys(slots, task), policy, self.sampling, stop=stop)

    def add_groups(self, count: int) -> None:
        """Build the envs of ``count`` more slot-groups (more groups in flight at once, as the async
        pipeline keeps); ``collect`` still plays ``batch_size`` groups."""
        if count < 1:
            return
        self._envs.grow(count * self.group_size)

    def _play(
        self,
        tasks: dict[int, Task],
        policy: Policy,
        params: SamplingParams,
        evaluation: bool | None = None,
        *,
        stop: Callable[[Run], bool] | None = None,
    ) -> Run:
        """Play every given slot's task to the end: one generate call and one env phase per turn.
        A slot whose attempt failed starts its task again (``reset``) with the next turn's phase."""
        if self._closed:
            raise CollectionError("the collector is closed")
        run = Run(tasks, self.group_size, retries=self.episode_retries)
        budget = self._budget(policy)
        prompts: dict[int, Sequence[int]] = {}
        starting = list(tasks)
        while starting or prompts:
            if stop is not None and stop(run):
                return run
            prompts.update(self._start(run, starting, evaluation, budget))
            if self.context_policy != "error":  # a conversation outgrowing the context is rewritten
                prompts = {s: self._make_room(run, s, p, budget, params) for s, p in prompts.items()}
            for s in [s for s in prompts if budget.full(len(prompts[s]))]:  # no room: no model work
                self._end_at_context(run, s, budget)
                del prompts[s]
            live = list(prompts)
            gens = dict(zip(live, self._generate(policy, [prompts[s] for s in live], params, run))) if live else {}
            sizes = {s: len(self._envs[s].trajectory.token_ids) for s in live}
            for s in live:
                if gens[s].finish_reason == "context" and not gens[s].token_ids:  # the policy saw no room
                    self._end_at_context(run, s, budget)
                    del prompts[s]
            actions = {
                s: ((self._envs[s].prepare_step(g.token_ids, logprobs=g.logprobs, version=g.version),), {})
                for s in prompts
                for g in (gens[s],)
            }
            used = {s: sizes[s] + len(gens[s].token_ids) for s in actions}
            stepped = self._run_envs(run, "step", actions, used, budget)
            for s in actions:
                if s not in stepped:  # failed or ended at the context: already recorded
                    del prompts[s]
                    continue
                harness = self._envs[s]
                if gens[s].finish_reason == "context":
                    run.finish(s, harness.trajectory, cut_at=used[s])
                    del prompts[s]
                elif harness.done:
                    run.finish(s, harness.trajectory)
                    del prompts[s]
                else:
                    prompts[s] = stepped[s][0]
            starting = run.take_replays()
        return run

    def _start(
        self, run: Run, slots: list[int], evaluation: bool | None, budget: ContextBudget
    ) -> dict[int, Sequence[int]]:
        """Reset ``slots`` to their tasks (building the envs that failed earlier first); their prompts."""
        ready = []
        for slot in slots:
            try:
                self._envs.ready(slot)  # built again when its env failed earlier
            except Exception as exc:  # reported, and retried like any failed attempt
                run.fail(slot, "create", exc, None)
                continue
            ready.append(slot)
        tasks = run.tasks
        requests = {s: ((tasks[s].seed,), {"row_index": tasks[s].row_index, "evaluation": evaluation}) for s in ready}
        started = self._run_envs(run, "reset", requests, dict.fromkeys(ready, 0), budget)
        return {s: result[0] for s, result in started.items()}

    def _make_room(
        self, run: Run, slot: int, prompt: Sequence[int], budget: ContextBudget, params: SamplingParams
    ) -> Sequence[int]:
        """The slot's next prompt: rewritten by the context policy (a new sample, counted) when
        ``prompt`` leaves too little room for the next completion, else ``prompt`` itself."""
        limit = budget.max_model_len
        if limit is None:
            return prompt
        room = room_for(limit, params.max_new_tokens)
        if len(prompt) + room <= limit:
            return prompt
        with self._apply_lock:  # lanes share the renderer and tokenizer
            rewritten = self._envs[slot].make_room(limit - room, target_for(limit))
        if rewritten is None:  # nothing to drop, or no rewrite fits: it goes on as under error
            return prompt
        run.rewrote_context(self.context_policy)
        return rewritten

    def _end_at_context(self, run: Run, slot: int, budget: ContextBudget) -> None:
        """End an episode the context cannot hold: cut after its last generated token, or, when
        the opening prompt alone fills the context, lose it (it has nothing to learn from)."""
        traj = self._envs[slot].trajectory
        if any(any(sample.action_mask) for sample in traj.samples):
            run.finish(slot, traj, cut_at=end_of_last_action(traj))
        else:
            run.overflow(slot, budget.no_room(len(traj.token_ids)))

    def _budget(self, policy: Policy) -> ContextBudget:
        """The context of this collection: ``max_model_len`` given here, else the policy's own."""
        limit = self.max_model_len or getattr(policy, "max_model_len", None)
        if self._context is None or self._context.max_model_len != limit:
            self._context = ContextBudget.for_tokenizer(self.tokenizer, limit)
        return self._context

    def _generate(
        self, policy: Policy, prompts: list[Sequence[int]], params: SamplingParams, run: Run
    ) -> list[Generation]:
        t0 = time.perf_counter()
        generations = policy.generate(prompts, params)
        run.generation_time_s += time.perf_counter() - t0
        run.generation_calls += 1
        if len(generations) != len(prompts):
            raise CollectionError(
                f"{type(policy).__name__}.generate returned {len(generations)} completions for "
                f"{len(prompts)} prompts; it must return one per prompt, in order"
            )
        run.generated_tokens += sum(len(g.token_ids) for g in generations)
        if run.oldest_version is None and generations:  # versions only grow: the first call's is the oldest
            run.oldest_version = generations[0].version
        return generations

    def _run_envs(
        self,
        run: Run,
        method: str,
        requests: dict[int, tuple[tuple[Any, ...], dict[str, Any]]],
        used: dict[int, int],
        budget: ContextBudget,
    ) -> dict[int, Any]:
        """Call ``client.<method>(*args, **kwargs)`` for every slot in ``requests`` at once, then
        apply each answer to its harness here, on one thread, after the renderer has seen all the
        answers (to tokenize them in one batch). Failed slots are recorded and their envs
        replaced; an answer too long for the context left (``used`` tokens) ends its episode
        untokenized; the rest map to what ``apply_reset``/``apply_step`` returned."""
        if not requests:
            return {}
        slots = list(requests)
        clients = [self._envs[s].client for s in slots]
        timeout = self.env_timeout_s
        if method == "reset" and timeout is not None:
            timeout += self._reconnect_s
        t0 = time.perf_counter()
        if self._threaded:  # the hand-tuned fast path: sync calls on worker threads, one latch
            calls = [partial(getattr(c, method), *requests[s][0], **requests[s][1]) for c, s in zip(clients, slots)]
            results = run_in_threads(self._envs.threads, calls, timeout, method)
        else:
            acalls = [
                partial(getattr(c, "a" + method), *requests[s][0], **requests[s][1]) for c, s in zip(clients, slots)
            ]
            results = run_on_loop(shared_loop(), acalls, timeout, method)
        run.env_time_s += time.perf_counter() - t0
        for result in results:
            if isinstance(result, (KeyboardInterrupt, EnvUnavailable)):  # the user, or an outage: stop
                raise result
        oversize = {
            s
            for s, r in zip(slots, results)
            if not isinstance(r, BaseException) and budget.cannot_fit(answer_chars(method, r), used[s])
        }
        answers = [(s, r) for s, r in zip(slots, results) if not isinstance(r, BaseException) and s not in oversize]
        with self._apply_lock:  # lanes playing their own groups share the renderer and tokenizer
            return self._apply(run, method, slots, requests, results, oversize, answers, budget)

    def _apply(
        self,
        run: Run,
        method: str,
        slots: list[int],
        requests: dict[int, tuple[tuple[Any, ...], dict[str, Any]]],
        results: list[Any],
        oversize: set[int],
        answers: list[tuple[int, Any]],
        budget: ContextBudget,
    ) -> dict[int, Any]:
        """The answers of one env phase into their harnesses (see ``_run_envs``)."""
        try:
            self._warm(method, answers)
        except Exception:  # only a speed-up: apply meets (and reports) the same error
            log.debug("batch tokenization failed; tokenizing answer by answer", exc_info=True)
        applied: dict[int, Any] = {}
        for s, result in zip(slots, results):
            harness = self._envs[s]
            try:
                if isinstance(result, BaseException):
                    raise late_call(harness.client, result)  # a timeout names the call_tool it caught
                if s in oversize:
                    self._too_long(run, s, method, result, budget)
                elif method == "reset":
                    (seed,), keywords = requests[s]
                    applied[s] = harness.apply_reset(result, seed=seed, row_index=keywords["row_index"])
                else:
                    applied[s] = harness.apply_step(result)
            except BaseException as exc:  # one env's failure must not end the batch (SystemExit included)
                if isinstance(exc, KeyboardInterrupt):
                    raise
                run.fail(s, method, exc, harness.trajectory if method == "step" else None)
                self._envs.drop(s)
        return applied

    def _too_long(self, run: Run, slot: int, method: str, result: Any, budget: ContextBudget) -> None:
        """End an episode whose env answered with more text than the context has room for,
        without tokenizing that text: a reset is lost; a step keeps its action and reward."""
        if method == "reset":
            run.overflow(slot, budget.too_long(answer_chars(method, result)))
            return
        harness = self._envs[slot]
        harness.apply_step(("", *result[1:]))  # the action and its reward; the text is never tokenized
        run.finish(slot, harness.trajectory, cut_at=end_of_last_action(harness.trajectory))

    def _warm(self, method: str, answers: list[tuple[int, Any]]) -> None:
        """Tokenize every answer's new text in one batch per renderer (one per tool set)."""
        batches: dict[int, tuple[ChatRenderer, list[Any]]] = {}
        for s, result in answers:
            harness = self._envs[s]
            if method == "reset":
                renderer, item = harness.renderer_for(result[1]), harness.opening_messages(*result)
            else:
                renderer, item = harness.renderer, (harness.observation_role_for(result[4]), result[0])
            batches.setdefault(id(renderer), (renderer, []))[1].append(item)
        for renderer, items in batches.values():
            renderer.warm(**{"openings" if method == "reset" else "observations": items})

    def close(self) -> None:
        """Close every env exactly once; the collector cannot collect afterwards."""
        if self._closed:
            return
        self._closed = True
        self._envs.close()

    def __enter__(self) -> RolloutCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- evaluation ---------------------------------------------------------------------------

    def evaluate(self, policy: Policy, *, num_episodes: int | None = None) -> EvalResult:
        """Greedy episodes, one at a time, on one extra env built at the first evaluation.

        Dataset envs (with ``eval_dataset_size``) play their held-out rows, all of them or the
        first ``num_episodes``; other envs play seeds ``0 .. num_episodes-1``, the same every time.
        """
        slot = self.num_slots
        held_out = self._envs.ready(slot).info.eval_dataset_size
        num_episodes = evaluation_episodes(held_out, num_episodes, "this env")
        greedy = replace(self.sampling, temperature=0.0)
        rewards: list[float] = []
        failures = retries = 0
        first_failure = ""
        for episode in range(num_episodes):
            task = Task(episode, episode if held_out is not None else None)
            run = self._play({slot: task}, policy, greedy, evaluation=True if held_out is not None else None)
            traj = run.trajectories[slot]
            retries += run.replayed
            if traj.error is None:
                rewards.append(traj.total_reward)
            else:
                failures += 1
                first_failure = first_failure or f"episode {episode}, {run.first_loss()}"
        if not rewards:
            raise CollectionError(
                f"every one of the {num_episodes} evaluation episodes failed; the first, "
                f"{first_failure}. {ENV_CHECK_HINT}."
            )
        mean = statistics.fmean(rewards)
        accuracy = mean / self.max_reward if self.max_reward else None
        return EvalResult(mean, accuracy, len(rewards), failures, retries)
