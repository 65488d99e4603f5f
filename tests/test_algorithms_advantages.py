"""Collation and advantage estimation against hand-computed values on small tensors."""

from __future__ import annotations

import math

import pytest
import torch

from agilerl.errors import TrajectoryShapeError
from agilerl.builtins.algorithms.advantages import (
    discounted_returns,
    gae,
    group_normalize,
    has_per_turn_rewards,
    leave_one_out_mean,
    per_turn_to_tokens,
    rewards_at_turn_ends,
    turn_action_bounds,
)
from agilerl.builtins.algorithms.grpo import GRPO
from agilerl.train.batch import collate_trajectories
from agilerl.rollout.trajectory import Trajectory

EPS = 1e-4


def two_turns(rewards: list[float], group: int = 0, **kwargs) -> Trajectory:
    """prompt (2 tokens), completion (2), observation (1), completion (1): turns -1 -1 0 0 0 1."""
    turns = len(rewards)
    ids = [1, 2, 3, 4, 5, 6][: 2 + 3 * turns - (1 if turns == 2 else 0)]
    actions = [False, False, True, True, False, True][: len(ids)]
    turn_ids = [-1, -1, 0, 0, 0, 1][: len(ids)]
    return Trajectory(
        token_ids=ids,
        action_mask=actions,
        turn_ids=turn_ids,
        rewards=rewards,
        group=group,
        **kwargs,
    )


def test_collate_pads_right_and_marks_failed_rollouts():
    ok = two_turns([1.0, 0.5], logprobs=[0, 0, -1.0, -2.0, 0, -3.0])
    failed = Trajectory(
        token_ids=[1, 2, 3],
        action_mask=[False, False, True],
        turn_ids=[-1, -1, 0],
        rewards=[7.0],
        group=0,
        error="env crashed",
        logprobs=[0, 0, -0.5],
    )
    batch = collate_trajectories([ok, failed], pad_id=99)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5, 6], [1, 2, 3, 99, 99, 99]]
    assert batch.attention_mask.tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]
    assert batch.turn_ids[1].tolist() == [-1, -1, 0, -1, -1, -1]
    assert batch.turn_rewards.tolist() == [[1.0, 0.5], [0.0, 0.0]]  # a failure scores zero
    assert batch.turn_mask.tolist() == [[True, True], [True, False]]
    assert batch.valid.tolist() == [True, False]
    assert batch.old_logprobs[0].tolist() == [0, 0, -1.0, -2.0, 0, -3.0]
    assert batch.loss_mask[1].sum() == 0 and batch.loss_mask[0].sum() == 3


def test_collate_drops_old_logprobs_unless_every_rollout_has_them():
    batch = collate_trajectories([two_turns([1.0], logprobs=[0.0] * 5), two_turns([0.0])], pad_id=0)
    assert batch.old_logprobs is None


def test_collate_names_the_misaligned_list():
    bad = Trajectory(
        token_ids=[1, 2, 3], action_mask=[True, True], turn_ids=[0, 0, 0], rewards=[1.0]
    )
    with pytest.raises(
        TrajectoryShapeError, match="trajectory 1: action_mask has 2 entries but token_ids has 3"
    ):
        collate_trajectories([two_turns([1.0]), bad], pad_id=0)


def test_trajectory_advantages_are_group_normalised_sums():
    trajs = [
        two_turns([1.0, 0.0]),
        two_turns([0.0, 0.0]),
        two_turns([1.0, 1.0]),
        two_turns([2.0, 0.0], group=1),
    ]
    batch = collate_trajectories(trajs, pad_id=0)
    adv = GRPO().advantages(batch, "trajectory")
    std = math.sqrt(2 / 3)  # totals 1, 0, 2: mean 1, population std
    expected = [0.0, -1 / (std + EPS), 1 / (std + EPS), 0.0]  # a group of one carries no signal
    for row, value in enumerate(expected):
        assert adv[row].tolist() == pytest.approx([0, 0, value, value, 0, value], abs=1e-6)


def test_turn_advantages_normalise_each_turn_over_its_players():
    trajs = [two_turns([1.0, 0.0]), two_turns([0.0]), two_turns([1.0, 1.0])]
    batch = collate_trajectories(trajs, pad_id=0)
    adv = GRPO().advantages(batch, "turn")
    third = (1 / 3) / (math.sqrt(2 / 9) + EPS)  # turn 0: rewards 1, 0, 1 -> mean 2/3
    half = 0.5 / (0.5 + EPS)  # turn 1 was played by rows 0 and 2 only: rewards 0, 1
    assert adv[0].tolist() == pytest.approx([0, 0, third, third, 0, -half], abs=1e-5)
    assert adv[1].tolist() == pytest.approx([0, 0, -2 * third, -2 * third, 0, 0], abs=1e-5)
    assert adv[2].tolist() == pytest.approx([0, 0, third, third, 0, half], abs=1e-5)


def test_identical_rewards_give_exactly_zero_and_no_nan():
    values = torch.tensor([[0.1], [0.1], [0.1]])
    adv = group_normalize(values, torch.ones(3, 1, dtype=torch.bool), torch.tensor([5, 5, 5]))
    assert adv.tolist() == [[0.0], [0.0], [0.0]]


def test_unscaled_advantages_are_mean_centred():
    adv = group_normalize(
        torch.tensor([[3.0], [1.0]]),
        torch.ones(2, 1, dtype=torch.bool),
        torch.tensor([0, 0]),
        scale=False,
    )
    assert adv.tolist() == [[1.0], [-1.0]]


def test_failed_rollout_leaves_its_groups_statistics_and_gets_no_advantage():
    trajs = [two_turns([1.0]), two_turns([0.0]), two_turns([1.0], error="timeout")]
    batch = collate_trajectories(trajs, pad_id=0)
    adv = GRPO().advantages(batch, "trajectory")
    assert adv[0, 2].item() == pytest.approx(0.5 / (0.5 + EPS))  # against its finished sibling only
    assert adv[1, 2].item() == pytest.approx(-0.5 / (0.5 + EPS))
    assert adv[2].abs().sum() == 0
    assert batch.group.tolist() == [0, 0, -3]


def test_auto_picks_turn_only_when_rewards_come_before_the_last_turn():
    final_only = collate_trajectories([two_turns([0.0, 1.0]), two_turns([0.0, 0.0])], pad_id=0)
    per_turn = collate_trajectories([two_turns([0.5, 1.0]), two_turns([0.0, 0.0])], pad_id=0)
    single = collate_trajectories([two_turns([1.0]), two_turns([0.0])], pad_id=0)
    assert not has_per_turn_rewards(final_only) and GRPO().granularity(final_only) == "trajectory"
    assert has_per_turn_rewards(per_turn) and GRPO().granularity(per_turn) == "turn"
    assert GRPO().granularity(single) == "trajectory"


def test_turn_bounds_and_rewards_on_the_last_action_token():
    batch = collate_trajectories([two_turns([1.0, 2.0]), two_turns([3.0])], pad_id=0)
    first, last = turn_action_bounds(batch.turn_ids, batch.action_mask, batch.max_turns)
    assert first.tolist() == [[2, 5], [2, -1]] and last.tolist() == [[3, 5], [3, -1]]
    assert rewards_at_turn_ends(batch).tolist() == [[0, 0, 0, 1, 0, 2], [0, 0, 0, 3, 0, 0]]
    assert per_turn_to_tokens(torch.tensor([[10.0, 20.0]]), batch.turn_ids[:1]).tolist() == [
        [0, 0, 10, 10, 10, 20]
    ]


def test_gae_skips_unmasked_steps():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 9.0, 0.25]])
    mask = torch.tensor([[True, False, True]])
    # step 2: delta = 1 - 0.25; step 0: delta = 0 + 0.9 * 0.25 - 0.5, plus 0.9 * 0.8 * 0.75
    adv = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert adv[0].tolist() == pytest.approx([0.9 * 0.25 - 0.5 + 0.72 * 0.75, 0.0, 0.75])


def test_discounted_returns_and_leave_one_out_baseline():
    returns = discounted_returns(
        torch.tensor([[1.0, 0.0, 2.0]]), torch.ones(1, 3, dtype=torch.bool), 0.5
    )
    assert returns.tolist() == [[1.5, 1.0, 2.0]]
    baseline = leave_one_out_mean(torch.tensor([1.0, 2.0, 3.0, 5.0]), torch.tensor([0, 0, 0, 1]))
    assert baseline.tolist() == [2.5, 2.0, 1.5, 0.0]


def test_to_moves_every_tensor_and_keeps_missing_logprobs_missing():
    batch = collate_trajectories([two_turns([1.0]), two_turns([0.0])], pad_id=0)
    moved = batch.to("meta")
    assert moved.input_ids.device.type == "meta" and moved.turn_mask.device.type == "meta"
    assert moved.old_logprobs is None and batch.input_ids.device.type == "cpu"
