"""Adaptive task sampling: informative rows are drawn more often, a floor keeps the others,
envs without rows are bucketed by seed, ranks merge their counts, and the state round-trips so
that a resumed stream is the unbroken one."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from agilerl.errors import InvalidArgument
from agilerl.rollout.assigner import Task, TaskAssigner
from agilerl.rollout.task_sampling import HISTORY, SEED_BUCKETS
from agilerl.rollout.trajectory import Trajectory

INFORMATIVE, SOLVED, HOPELESS = range(0, 3), range(3, 7), range(7, 10)


def rewards_for(row: int, member: int) -> float:
    """A fixed world: rows 0-2 split their groups, 3-6 are always solved, 7-9 never."""
    if row in INFORMATIVE:
        return float(member % 2)
    return 1.0 if row in SOLVED else 0.0


def played(tasks: list[Task], group_size: int, world=rewards_for) -> list[Trajectory]:
    """The trajectories a collector would return for ``tasks`` (slot ``i`` in group ``i // G``)."""
    return [
        Trajectory(
            group=i // group_size, seed=task.seed, row_index=task.row_index,
            rewards=[world(task.row_index if task.row_index is not None else task.seed, i % group_size)],
        )
        for i, task in enumerate(tasks)
    ]


def trained(assigner: TaskAssigner, steps: int, batch: int = 5, group: int = 2) -> list[list[Task]]:
    """``steps`` collect-and-observe rounds; the tasks each drew."""
    drawn = []
    for _ in range(steps):
        tasks = assigner.assign(batch, group)
        assigner.observe(played(tasks, group))
        drawn.append(tasks[::group])
    return drawn


def test_informative_rows_are_drawn_more_often_and_the_floor_keeps_the_rest():
    assigner = TaskAssigner(10, seed=3, sampling="adaptive", floor=0.25)
    trained(assigner, 100)
    sampler = assigner.adaptive
    assert [seen for _, seen, _ in sampler.state()] == [HISTORY] * 10  # every row's memory is full
    p = [sampler.probability(row) for row in range(10)]
    assert sum(p) == pytest.approx(1.0)
    # weights 60 * (2k + 1) / (seen + 1): 108 informative, 12 otherwise; a quarter of draws uniform
    total = 3 * 108 + 7 * 12
    assert p[0] == pytest.approx(0.025 + 0.75 * 108 / total)
    assert p[9] == pytest.approx(0.025 + 0.75 * 12 / total) and p[9] > 0.025  # the floor: 1/4 of uniform
    counts = Counter(task.row_index for _ in range(400) for task in assigner.assign(10, 1))
    for row in INFORMATIVE:
        assert counts[row] > 2 * max(counts[r] for r in (*SOLVED, *HOPELESS))
    for row in (*SOLVED, *HOPELESS):  # solved and hopeless rows still come back
        assert counts[row] >= 0.5 * 0.025 * 4000


def test_a_row_that_stops_being_informative_falls_back_to_the_floor_share():
    assigner = TaskAssigner(4, seed=0, sampling="adaptive")
    row_zero = [Task(1, 0), Task(1, 0)]
    assigner.observe(played(row_zero, 2, world=lambda row, member: float(member)))
    high = assigner.adaptive.probability(0)
    for _ in range(HISTORY):  # the policy learned it: its last HISTORY groups all solved
        assigner.observe(played(row_zero, 2, world=lambda row, member: 1.0))
    assert assigner.adaptive.probability(0) < assigner.adaptive.probability(1) < high


def test_groups_that_cannot_be_compared_teach_nothing():
    assigner = TaskAssigner(4, seed=0, sampling="adaptive")
    lone = played([Task(1, 0), Task(1, 0)], 2)
    lone[1].error = "env timed out"  # one finished rollout: no comparison
    assigner.observe(lone)
    assert assigner.adaptive.state() == []


def test_envs_without_rows_are_bucketed_by_seed():
    assigner = TaskAssigner(None, seed=1, sampling="adaptive", floor=0.1)
    world = lambda seed, member: float(member % 2) if seed % SEED_BUCKETS < 8 else 1.0  # noqa: E731
    for _ in range(60):
        tasks = assigner.assign(16, 2)
        assert all(task.row_index is None and 0 <= task.seed < 2**31 for task in tasks)
        assigner.observe(played(tasks, 2, world=world))
    buckets = Counter(task.seed % SEED_BUCKETS for task in assigner.assign(4000, 1))
    informative = sum(buckets[b] for b in range(8)) / 4000
    assert informative > 0.4  # 8 of 64 buckets, an eighth under uniform sampling
    assert len(buckets) == SEED_BUCKETS  # and every bucket still comes back
    assert len({task.seed for task in assigner.assign(200, 1)}) > 190  # fresh seeds within buckets


def test_uniform_sampling_ignores_outcomes_and_deals_as_before():
    plain, told = TaskAssigner(10, seed=4), TaskAssigner(10, seed=4)
    for _ in range(5):
        tasks = told.assign(5, 2)
        told.observe(played(tasks, 2))
        assert tasks == plain.assign(5, 2)
    assert told.adaptive is None and told.pending == []


def round_trip(assigner: TaskAssigner) -> TaskAssigner:
    state = json.loads(json.dumps(assigner.state_dict()))  # as a checkpoint holds it
    resumed = TaskAssigner(assigner.dataset_size, seed=assigner.seed, rank=assigner.rank,
                           world_size=assigner.world_size, sampling=assigner.sampling)
    resumed.load_state_dict(state)
    return resumed


@pytest.mark.parametrize("sampling", ["uniform", "adaptive"])
@pytest.mark.parametrize("rows", [10, None])
def test_resume_draws_exactly_what_an_unbroken_run_draws(sampling, rows):
    """A resumed loop passes over the tasks it trained (the collector's skip, the pipeline's
    re-draw), then plays on: the stream after the checkpoint is the unbroken run's."""
    unbroken = TaskAssigner(rows, seed=7, sampling=sampling)
    stopped = TaskAssigner(rows, seed=7, sampling=sampling)
    before = trained(stopped, 7)  # 35 tasks: mid-epoch for uniform rows
    assert before == trained(unbroken, 7)
    resumed = round_trip(stopped)
    assert [resumed.assign(5, 2)[::2] for _ in range(7)] == before  # passed over, not played
    assert trained(resumed, 12) == trained(unbroken, 12)
    if sampling == "adaptive":
        assert resumed.adaptive.state() == unbroken.adaptive.state() != []
        assert round_trip(resumed).state_dict() == unbroken.state_dict()  # and again, from the second resume


def test_a_resumed_stream_hands_out_tasks_in_flight_at_the_save_again():
    """Tasks drawn but never trained (groups in flight in async training) come back in order,
    wherever the loop's re-draw stops."""
    assigner = TaskAssigner(10, seed=2, sampling="adaptive")
    trained(assigner, 3)
    in_flight = assigner.assign(2, 1)
    resumed = round_trip(assigner)
    resumed.assign(15, 1)  # the 15 trained ones, re-drawn
    assert resumed.assign(3, 1) == [*in_flight, *assigner.assign(1, 1)]


def test_a_checkpoint_of_other_settings_is_refused_naming_them():
    state = TaskAssigner(10, seed=2, sampling="adaptive").state_dict()
    with pytest.raises(InvalidArgument, match=r"sampling 'adaptive' -> 'uniform'.*training.task_sampling"):
        TaskAssigner(10, seed=2).load_state_dict(state)
    with pytest.raises(InvalidArgument, match="dataset_size 10 -> 12"):
        TaskAssigner(12, seed=2, sampling="adaptive").load_state_dict(state)


def test_two_ranks_merge_their_counts_into_the_same_weights():
    ranks = [TaskAssigner(10, seed=5, rank=r, world_size=2, sampling="adaptive") for r in range(2)]
    single = TaskAssigner(10, seed=5, sampling="adaptive")
    for _ in range(6):
        drawn = [rank.assign(3, 2) for rank in ranks]
        assert drawn[0] != drawn[1]  # each rank draws from its own generator
        for rank, tasks in zip(ranks, drawn, strict=True):
            rank.observe(played(tasks, 2))
        assert all(rank.pending for rank in ranks)
        assert ranks[0].adaptive.state() == ranks[1].adaptive.state()  # nothing counted before the merge
        gathered = json.loads(json.dumps([rank.pending for rank in ranks]))  # as gather_object hands it
        for rank in ranks:
            rank.merge(gathered)
        for tasks in drawn:  # one process seeing both ranks' groups, in rank order
            single.observe(played(tasks, 2))
        assert ranks[0].pending == ranks[1].pending == []
        assert ranks[0].adaptive.state() == ranks[1].adaptive.state() == single.adaptive.state()
    assert [ranks[0].adaptive.probability(r) for r in range(10)] == [ranks[1].adaptive.probability(r) for r in range(10)]


def test_pending_outcomes_survive_a_checkpoint():
    rank = TaskAssigner(10, seed=5, rank=1, world_size=2, sampling="adaptive")
    rank.observe(played(rank.assign(2, 2), 2))
    assert round_trip(rank).pending == rank.pending != []


def test_bad_settings_are_clear_errors():
    with pytest.raises(InvalidArgument, match="'uniform' or 'adaptive'"):
        TaskAssigner(10, seed=0, sampling="greedy")
    with pytest.raises(InvalidArgument, match=r"task_sampling_floor must be in \(0, 1\]"):
        TaskAssigner(10, seed=0, sampling="adaptive", floor=0.0)


def test_the_training_settings_name_a_floor_without_adaptive_sampling():
    from pydantic import ValidationError

    from agilerl.manifest.settings import TrainingSettings

    assert TrainingSettings(task_sampling="adaptive", task_sampling_floor=0.5).task_sampling_floor == 0.5
    with pytest.raises(ValidationError, match="applies to task_sampling: adaptive only.*set task_sampling: adaptive"):
        TrainingSettings(task_sampling_floor=0.5)
    with pytest.raises(ValidationError, match="task_sampling_floor"):
        TrainingSettings(task_sampling="adaptive", task_sampling_floor=0)
    with pytest.raises(ValidationError, match="'uniform' or 'adaptive'"):
        TrainingSettings(task_sampling="greedy")
