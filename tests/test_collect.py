"""RolloutCollector with real envs in this process, the tiny model and a scripted policy."""

from __future__ import annotations

import copy
import textwrap
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agilerl.rollout.collector import RolloutCollector
from agilerl.rollout.harness import RolloutHarness
from agilerl.generation.policy import (
    Generation,
    SamplingParams,
    ScriptedPolicy,
    TransformersPolicy,
)
from agilerl.manifest.spec import parse_env_spec, parse_manifest
from agilerl.train.batch import collate_trajectories
from agilerl.errors import AgileRLError, CollectionError


class CountingEnv:
    """Ends after ``seed % 3 + 1`` turns, reward 1 a turn; a ``fault`` env plays 3 turns and
    breaks at turn 2."""

    max_turns = 4
    dataset_size = 50

    def __init__(self, fault: str | None = None, release: threading.Event | None = None) -> None:
        self.fault = fault
        self.release = release
        self.closed = 0
        self.resets: list[tuple[int | None, int | None]] = []
        self.turn = 0
        self.length = 1

    def reset(self, seed=None, *, row_index=None, evaluation=None):
        self.resets.append((seed, row_index))
        self.turn, self.length = 0, 3 if self.fault else seed % 3 + 1
        return f"task {seed} row {row_index}", {}

    def step(self, action):
        self.turn += 1
        if self.turn == 2 and self.fault == "raise":
            raise RuntimeError("the env broke")
        if self.turn == 2 and self.fault == "hang":
            self.release.wait(10)
        return f"you said {action}", 1.0, self.turn >= self.length, False, {}

    def close(self):
        self.closed += 1


class Factory:
    """Builds CountingEnvs, the ``faulty`` ones (by build order) with a fault; keeps them all."""

    def __init__(self, faulty: dict[int, str] | None = None) -> None:
        self.faulty = faulty or {}
        self.envs: list[CountingEnv] = []
        self.release = threading.Event()

    def __call__(self) -> CountingEnv:
        env = CountingEnv(self.faulty.get(len(self.envs)), self.release)
        self.envs.append(env)
        return env


class RecordingPolicy:
    """Wraps a policy; keeps every (prompt, generation) and the batch size of every call."""

    def __init__(self, inner):
        self.inner = inner
        self.seen: dict[tuple[int, ...], list[Generation]] = {}
        self.prompts: list[list[int]] = []
        self.batch_sizes: list[int] = []

    def generate(self, prompts, params):
        out = self.inner.generate(prompts, params)
        self.batch_sizes.append(len(prompts))
        self.prompts += [list(p) for p in prompts]
        for prompt, gen in zip(prompts, out):
            self.seen.setdefault(tuple(prompt), []).append(gen)
        return out


def collector(factory, tokenizer, **kwargs):
    kwargs = {"batch_size": 3, "group_size": 2, "seed": 0, **kwargs}
    return RolloutCollector(factory, tokenizer, **kwargs)


def test_groups_share_their_task_and_every_slot_is_in_its_group(chatml_tokenizer):
    factory = Factory()
    with collector(factory, chatml_tokenizer, batch_size=4, group_size=3) as c:
        batch = c.collect(ScriptedPolicy(chatml_tokenizer))
    assert len(factory.envs) == 12 and len(batch.trajectories) == 12
    assert [len(g) for g in batch.groups] == [3, 3, 3, 3]
    for index, group in enumerate(batch.groups):
        assert {(t.seed, t.row_index) for t in group} == {(group[0].seed, group[0].row_index)}
        assert {t.group for t in group} == {index}
    assert len({g[0].row_index for g in batch.groups}) == 4
    # each slot's own env served its own task
    assert [env.resets[-1] for env in factory.envs] == [(t.seed, t.row_index) for t in batch.trajectories]


def test_masks_cover_exactly_the_generated_tokens_with_their_logprobs(tiny_model, chatml_tokenizer):
    policy = RecordingPolicy(TransformersPolicy(tiny_model, chatml_tokenizer))
    sampling = SamplingParams(max_new_tokens=6)
    with collector(Factory(), chatml_tokenizer, sampling=sampling) as c:
        batch = c.collect(policy)
    tensors = collate_trajectories(batch.trajectories, pad_id=chatml_tokenizer.pad_token_id)
    assert tensors.old_logprobs is not None
    for traj in batch.trajectories:
        assert traj.error is None
        starts = [i for i, m in enumerate(traj.action_mask) if m and (i == 0 or not traj.action_mask[i - 1])]
        assert len(starts) == traj.num_turns
        for start in starts:
            end = start
            while end < len(traj.action_mask) and traj.action_mask[end]:
                end += 1
            gens = policy.seen[tuple(traj.token_ids[:start])]  # the policy saw exactly this prompt...
            match = [g for g in gens if g.token_ids == traj.token_ids[start:end]]  # ...and made these
            assert match, "masked tokens are not a completion the policy generated for this prompt"
            assert traj.logprobs[start:end] == pytest.approx(match[0].logprobs)


def test_trajectories_equal_one_full_render_with_fresh_observations(chatml_tokenizer):
    """Every answer is new text, so the batched tokenization does all the work; it must match."""
    policy = ScriptedPolicy(chatml_tokenizer, reply=lambda prompt: f"n{len(prompt)}")
    with collector(Factory(), chatml_tokenizer) as c:
        batch = c.collect(policy)
    for traj in batch.trajectories:
        messages = [{"role": "user", "content": f"task {traj.seed} row {traj.row_index}"}]
        text = chatml_tokenizer.decode(traj.token_ids)
        replies = [part.split("<|im_end|>")[0] for part in text.split("<|im_start|>assistant\n")[1:]]
        assert len(replies) == traj.num_turns
        for reply in replies:
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"you said {reply}"}]
        rendered = chatml_tokenizer.apply_chat_template(messages, tokenize=False)
        assert traj.token_ids == chatml_tokenizer.encode(rendered, add_special_tokens=False)


def test_episodes_of_different_lengths_share_one_generate_call_per_turn(chatml_tokenizer):
    policy = RecordingPolicy(ScriptedPolicy(chatml_tokenizer))
    with collector(Factory(), chatml_tokenizer, batch_size=6, group_size=2) as c:
        batch = c.collect(policy)
    turns = [t.num_turns for t in batch.trajectories]
    assert turns == [t.seed % 3 + 1 for t in batch.trajectories]
    assert len(set(turns)) > 1
    # one call per turn; finished slots drop out of the next call
    assert policy.batch_sizes == [sum(n > turn for n in turns) for turn in range(max(turns))]
    assert batch.stats.generation_calls == max(turns)
    assert batch.stats.turns_mean == pytest.approx(sum(turns) / len(turns))
    assert batch.stats.group_reward_mean == [g[0].num_turns for g in batch.groups]


def test_env_that_raises_is_replayed_on_a_fresh_env_with_the_same_task(chatml_tokenizer):
    factory = Factory(faulty={3: "raise"})
    with collector(factory, chatml_tokenizer) as c:
        batch = c.collect(ScriptedPolicy(chatml_tokenizer, reply="x"))
        replayed = batch.trajectories[3]
        assert replayed.error is None and replayed.group == 1
        assert (replayed.seed, replayed.row_index) == (batch.trajectories[2].seed, batch.trajectories[2].row_index)
        assert [(f.slot, f.group, f.phase, f.retried) for f in batch.stats.failures] == [(3, 1, "step", True)]
        assert "the env broke" in batch.stats.failures[0].error
        assert factory.envs[6].resets == factory.envs[3].resets  # the same task, from reset
        assert batch.stats.retries == 1 and batch.stats.lost == 0
        assert factory.envs[3].closed == 1 or _eventually(lambda: factory.envs[3].closed == 1)
        again = c.collect(ScriptedPolicy(chatml_tokenizer))
        assert not again.stats.failures and len(factory.envs) == 7
    assert all(env.closed == 1 for env in factory.envs)


def test_a_rollout_lost_for_good_takes_its_group_out_when_too_few_are_left(chatml_tokenizer):
    factory = Factory(faulty={3: "raise", 6: "raise", 7: "raise"})  # slot 3 and both its replays
    with collector(factory, chatml_tokenizer) as c:
        batch = c.collect(ScriptedPolicy(chatml_tokenizer, reply="x"))
    lost, sibling = batch.trajectories[3], batch.trajectories[2]
    assert lost.error is not None and "the env broke" in lost.error
    assert sibling.error is not None and "group dropped: 1 of its 2 rollouts finished" in sibling.error
    assert [f.retried for f in batch.stats.failures] == [True, True, False]
    assert (batch.stats.retries, batch.stats.lost, batch.stats.groups_dropped) == (2, 1, 1)
    assert all(t.error is None for g in (0, 2) for t in batch.groups[g])
    valid = collate_trajectories(batch.trajectories, 0).valid.tolist()
    assert valid == [True, True, False, False, True, True]


class WatchedEvent(threading.Event):
    """An Event that records when a ``wait`` on it starts and when one returns."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting, self.returned = threading.Event(), threading.Event()

    def wait(self, timeout=None):
        self.waiting.set()
        try:
            return super().wait(timeout)
        finally:
            self.returned.set()


def test_env_that_hangs_past_the_timeout_is_reported_without_waiting_for_it(chatml_tokenizer):
    factory = Factory(faulty={0: "hang"})
    factory.release = hung = WatchedEvent()
    with collector(factory, chatml_tokenizer, env_timeout_s=0.3) as c:
        batch = c.collect(ScriptedPolicy(chatml_tokenizer))
        # collect() gave up on the env: it returned while the env's step was still blocked.
        assert hung.waiting.is_set() and not hung.returned.is_set()
        again = c.collect(ScriptedPolicy(chatml_tokenizer))  # the next batch runs on a fresh env
        assert not hung.returned.is_set() and len(factory.envs) == 7
        factory.release.set()
    assert not again.stats.failures and all(t.error is None for t in again.trajectories)
    assert batch.trajectories[0].error is not None and "env_timeout_s=0.3" in batch.trajectories[0].error
    assert batch.trajectories[0].num_turns == 1
    assert [(f.slot, f.phase) for f in batch.stats.failures] == [(0, "step")]
    # slot 0 timed out (a replay would wait as long again): lost, and its group with it
    assert sum(t.error is None for t in batch.trajectories) == 4 and batch.stats.groups_dropped == 1


def test_every_rollout_failing_is_a_clear_error(chatml_tokenizer):
    class Broken(CountingEnv):
        def reset(self, seed=None, **kwargs):
            raise ConnectionError("server gone")

    with collector(Broken, chatml_tokenizer) as c, pytest.raises(CollectionError, match=r"all 6 rollouts failed.*server gone.*agilerl env check"):
        c.collect(ScriptedPolicy(chatml_tokenizer))


def test_policy_returning_the_wrong_number_of_completions_is_named(chatml_tokenizer):
    class Short:
        def generate(self, prompts, params):
            return []

    with collector(Factory(), chatml_tokenizer) as c, pytest.raises(CollectionError, match="Short.generate returned 0"):
        c.collect(Short())


def test_context_overflow_ends_the_episode_truncated_within_the_limit(tiny_model, chatml_tokenizer):
    policy = TransformersPolicy(tiny_model, chatml_tokenizer, max_model_len=40)
    with collector(Factory(), chatml_tokenizer, sampling=SamplingParams(max_new_tokens=12)) as c:
        batch = c.collect(policy)
    overflowed = [t for t in batch.trajectories if t.info.get("truncated_by") == "max_model_len"]
    assert overflowed
    for traj in overflowed:
        assert traj.truncated and len(traj.token_ids) <= 40
        assert traj.action_mask[-1]  # cut right after the last generated token
        assert traj.num_turns == max(traj.turn_ids) + 1
        assert len(traj.action_mask) == len(traj.turn_ids) == len(traj.logprobs) == len(traj.token_ids)
    collate_trajectories(batch.trajectories, 0)


def test_close_closes_each_env_once(chatml_tokenizer):
    factory = Factory()
    c = collector(factory, chatml_tokenizer)
    c.collect(ScriptedPolicy(chatml_tokenizer))
    c.close()
    c.close()
    assert [env.closed for env in factory.envs] == [1] * 6
    with pytest.raises(CollectionError, match="closed"):
        c.collect(ScriptedPolicy(chatml_tokenizer))


def test_max_turns_comes_from_the_env_or_must_be_given(chatml_tokenizer):
    class NoBudget:
        def reset(self, seed=None):
            return "hi", {}

        def step(self, action):
            return "", 0.0, True, False, {}

    with pytest.raises(AgileRLError, match="NoBudget declares no usable max_turns.*pass max_turns="):
        collector(NoBudget, chatml_tokenizer)
    with collector(NoBudget, chatml_tokenizer, max_turns=2) as c:
        assert c.max_turns == 2
        assert c.assigner.dataset_size is None
        assert all(t.row_index is None for t in c.collect(ScriptedPolicy(chatml_tokenizer)).trajectories)


def test_each_slot_builds_its_env_once_and_the_turn_budget_comes_from_that_env(tmp_path, chatml_tokenizer):
    (tmp_path / "envs.py").write_text(
        textwrap.dedent(
            """
            class Logged:
                max_turns = 3

                def __init__(self, log):
                    with open(log, "a") as f:
                        f.write("built\\n")

                def reset(self, seed=None):
                    return "hi", {}

                def step(self, action):
                    return "ok", 1.0, False, False, {}
            """
        )
    )
    log = tmp_path / "built.txt"
    spec = parse_env_spec({"env_type": "rollout", "entrypoint": "envs.py:Logged", "env_config": {"log": str(log)}})
    built = lambda: len(log.read_text().splitlines())  # noqa: E731
    with RolloutCollector.from_spec(spec, chatml_tokenizer, batch_size=3, group_size=2, base_dir=tmp_path, seed=0) as c:
        assert built() == 6  # one per slot: none built only to read max_turns
        assert c.max_turns == 3
        batch = c.collect(ScriptedPolicy(chatml_tokenizer))
        assert [t.num_turns for t in batch.trajectories] == [3] * 6 and all(t.truncated for t in batch.trajectories)
        assert built() == 6
    with RolloutHarness.from_spec(spec, chatml_tokenizer, base_dir=tmp_path) as harness:
        assert harness.max_turns == 3 and built() == 7


REWARD_PY = textwrap.dedent(
    """
    def exact(completion, answer):
        return 2.0 if completion.strip() == str(answer) else 0.0
    """
)


def test_the_evaluation_env_is_built_at_the_first_evaluation_and_reused(chatml_tokenizer):
    factory, policy = Factory(), ScriptedPolicy(chatml_tokenizer)
    with collector(factory, chatml_tokenizer, batch_size=1, group_size=2) as c:
        c.collect(policy)
        assert len(factory.envs) == 2  # one per slot: none for evaluation yet
        c.evaluate(policy, num_episodes=2)
        c.evaluate(policy, num_episodes=2)
    assert len(factory.envs) == 3


def test_skip_continues_the_task_stream_where_the_skipped_batches_left_it(chatml_tokenizer):
    def third_batch_tasks(skip: bool) -> list[tuple[int | None, int | None]]:
        factory, policy = Factory(), ScriptedPolicy(chatml_tokenizer)
        with collector(factory, chatml_tokenizer) as c:
            if skip:
                c.skip(2)
            else:
                c.collect(policy), c.collect(policy)
            before = sum(len(env.resets) for env in factory.envs)
            c.collect(policy)
        resets = [r for env in factory.envs for r in env.resets]
        assert len(resets) - before == 6  # batch_size 3 x group_size 2, none replayed
        return sorted(r for env in factory.envs for r in env.resets[-1:])

    assert third_batch_tasks(skip=True) == third_batch_tasks(skip=False)


def test_from_spec_and_greedy_evaluation_over_the_held_out_rows(tmp_path, chatml_tokenizer):
    rows = [{"question": f"{i} + {i}", "answer": str(2 * i)} for i in range(20)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "qa.parquet")
    (tmp_path / "reward.py").write_text(REWARD_PY)
    spec = parse_env_spec(
        {
            "env_type": "rollout",
            "dataset": "qa.parquet",
            "rubric_file_path": "reward.py",
            "rubric_name": "exact",
            "train_test_split": 0.75,
            "max_reward": 2.0,
        }
    )

    def number(prompt) -> int:
        return int(chatml_tokenizer.decode(prompt).split(" + ")[0].split()[-1])

    def answer_even(prompt):  # right on questions about even numbers, wrong otherwise
        n = number(prompt)
        return str(2 * n) if n % 2 == 0 else "?"

    policy = RecordingPolicy(ScriptedPolicy(chatml_tokenizer, reply=answer_even))
    with RolloutCollector.from_spec(spec, chatml_tokenizer, batch_size=2, group_size=2, base_dir=tmp_path, seed=0) as c:
        assert c.max_turns == 1 and c.assigner.dataset_size == 15
        batch = c.collect(policy)
        assert {t.total_reward for t in batch.trajectories} <= {0.0, 2.0}
        result = c.evaluate(policy)
    held_out = [number(p) for p in policy.prompts[-5:]]  # the evaluation's questions
    assert len(set(held_out)) == 5
    expected = sum(n % 2 == 0 for n in held_out) / 5
    assert result.episodes == 5 and result.failures == 0
    assert result.accuracy == pytest.approx(expected)
    assert result.mean_reward == pytest.approx(2 * expected)
    assert policy.batch_sizes[-5:] == [1] * 5


def test_from_spec_names_the_env_file_and_passes_template_kwargs(tmp_path, chatml_tokenizer):
    (tmp_path / "env.py").write_text(
        textwrap.dedent(
            """
            class Echo:
                max_turns = 2
                def reset(self, seed=None):
                    return "say something", {}
                def step(self, action):
                    return "again", 0.5, False, False, {}
            """
        )
    )
    manifest = parse_manifest(
        {"environment": {"env_type": "rollout", "entrypoint": "env.py:Echo", "chat_template_kwargs": {"flag": True}}},
        base_dir=tmp_path,
    )
    tokenizer = copy.deepcopy(chatml_tokenizer)  # a template that shows the kwarg it was given
    tokenizer.chat_template = "{% if flag %}FLAG{% endif %}" + chatml_tokenizer.chat_template
    policy = RecordingPolicy(ScriptedPolicy(tokenizer))
    with RolloutCollector.from_spec(
        manifest.environment, tokenizer, batch_size=1, group_size=2, base_dir=manifest.base_dir
    ) as c:
        batch = c.collect(policy)
    assert all(tokenizer.decode(p).startswith("FLAG") for p in policy.prompts)
    assert [t.num_turns for t in batch.trajectories] == [2, 2]
    assert all(t.truncated and t.total_reward == 1.0 for t in batch.trajectories)


def _eventually(check, timeout_s=2.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


def test_the_docs_example_runs(capsys):
    import re
    from pathlib import Path

    doc = Path(__file__).resolve().parent.parent / "docs" / "collector.md"
    example = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.DOTALL)[0]
    exec(compile(example, str(doc), "exec"), {"__name__": "docs_example"})  # noqa: S102 - our own docs
    out = capsys.readouterr().out
    assert "rollout/reward_mean" in out and "EvalResult(" in out
