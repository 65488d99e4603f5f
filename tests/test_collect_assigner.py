"""TaskAssigner: one task per group, rows shuffled per epoch, sharded by rank, replayable."""

from __future__ import annotations

import pytest

from agilerl.rollout.assigner import Task, TaskAssigner
from agilerl.errors import AgileRLError


def test_each_group_repeats_one_task_and_groups_differ():
    tasks = TaskAssigner(100, seed=0).assign(4, 3)
    assert len(tasks) == 12
    groups = [tasks[i : i + 3] for i in range(0, 12, 3)]
    assert all(len(set(group)) == 1 for group in groups)
    assert len({group[0].row_index for group in groups}) == 4
    assert len({group[0].seed for group in groups}) == 4


def test_every_row_once_per_epoch_in_a_new_order_each_epoch():
    assigner = TaskAssigner(10, seed=1)
    epoch0 = [t.row_index for t in assigner.assign(5, 1) + assigner.assign(5, 1)]
    epoch1 = [t.row_index for t in assigner.assign(10, 1)]
    assert sorted(epoch0) == sorted(epoch1) == list(range(10))
    assert epoch0 != epoch1
    assert assigner.epoch == 1


def test_same_seed_replays_the_same_tasks_and_another_seed_does_not():
    def run(seed):
        assigner = TaskAssigner(50, seed=seed)
        return [assigner.assign(8, 2) for _ in range(3)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_ranks_take_disjoint_equal_shares_of_each_epoch():
    shares = [TaskAssigner(11, seed=3, rank=r, world_size=2).assign(5, 1) for r in range(2)]
    rows = [{t.row_index for t in share} for share in shares]
    assert len(rows[0]) == len(rows[1]) == 5
    assert not rows[0] & rows[1]
    assert {t.seed for t in shares[0]} != {t.seed for t in shares[1]}


def test_env_without_rows_gets_seeds_only():
    tasks = TaskAssigner(None, seed=0).assign(3, 2)
    assert all(isinstance(t, Task) and t.row_index is None for t in tasks)
    assert len({t.seed for t in tasks}) == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dataset_size": 10, "world_size": 2}, "needs seed="),
        ({"dataset_size": 1, "seed": 0, "world_size": 2}, "smaller than world_size"),
        ({"dataset_size": 10, "seed": 0, "rank": 2, "world_size": 2}, "rank must be in"),
    ],
)
def test_bad_settings_name_the_fix(kwargs, message):
    with pytest.raises(AgileRLError, match=message):
        TaskAssigner(**kwargs)
