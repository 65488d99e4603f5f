"""One episode, several training samples: collation, per-episode advantages and their weights.

An episode split into samples (``Trajectory.prior_samples``) must train exactly like the same
episode in one row, token for token, for every algorithm that averages over tokens; and GSPO,
which averages per row, weighs an episode's rows 1/samples each.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from agilerl.builtins.algorithms.advantages import (
    group_normalize,
    leave_one_out_mean,
    merge_turns,
    over_episodes,
    per_episode,
    to_rows,
)
from agilerl.builtins.algorithms.off_policy import Correction
from agilerl.errors import TrajectoryShapeError
from agilerl.rollout.trajectory import Trajectory
from agilerl.train.algorithm import build_algorithm
from agilerl.train.batch import collate_trajectories
from agilerl.train.trainer import split_rows

# An episode: a prompt, then turns of (completion ids, observation ids); rewards per turn.
TURNS_A = [([10, 11], [20]), ([12], [21, 22]), ([13, 14, 15], [23])]
TURNS_B = [([30], [40]), ([31, 32], [41]), ([33], [42])]


def episode(turns, rewards, *, split: bool, group: int = 0, prompt=(1, 2)) -> Trajectory:
    """The episode in one sample, or split after every turn (each new sample opens with a fresh
    two-token prompt, as a restart renders one). Log-probs: -0.1 x the token id on actions."""
    traj = Trajectory(rewards=list(rewards), group=group, logprobs=[])
    _extend(traj, list(prompt), False, -1)
    for k, (action, observation) in enumerate(turns):
        if split and k > 0:
            traj.split()
            _extend(traj, [3, 4 + k], False, -1)
        _extend(traj, action, True, k)
        _extend(traj, observation, False, k)
    return traj


def _extend(traj: Trajectory, ids, acting: bool, turn: int) -> None:
    traj.token_ids += ids
    traj.action_mask += [acting] * len(ids)
    traj.turn_ids += [turn] * len(ids)
    traj.logprobs += [-0.1 * i if acting else 0.0 for i in ids]


def group_of_two(split_a: bool, rewards_a=(0.0, 0.0, 1.0), rewards_b=(0.0, 0.5, 0.0)):
    """One group: episode A (split into 3 samples or not) and episode B (never split)."""
    return [episode(TURNS_A, rewards_a, split=split_a), episode(TURNS_B, rewards_b, split=False)]


def test_a_split_episode_is_one_row_per_sample_carrying_the_episode():
    trajs = group_of_two(split_a=True)
    assert [len(t.samples) for t in trajs] == [3, 1]
    batch = collate_trajectories(trajs, pad_id=0)
    assert batch.input_ids.shape[0] == 4
    assert batch.episode.tolist() == [0, 0, 0, 1]
    assert batch.sample_weight.tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1.0])
    assert batch.is_split and batch.episode_ends.tolist() == [2, 3]
    # every row of A holds A's rewards over the episode's turns; its tokens keep their turn ids
    assert batch.turn_rewards.tolist() == [[0.0, 0.0, 1.0]] * 3 + [[0.0, 0.5, 0.0]]
    assert batch.turn_ids[1].tolist()[:5] == [-1, -1, 1, 1, 1]
    assert batch.input_ids[1].tolist()[:5] == [3, 5, 12, 21, 22]
    # the total weight of each episode is one
    totals = torch.zeros(2).index_add(0, batch.episode, batch.sample_weight)
    assert totals.tolist() == pytest.approx([1.0, 1.0])


def test_a_failed_split_episode_leaves_its_group_whole():
    trajs = group_of_two(split_a=True)
    trajs[0].error = "env crashed"
    batch = collate_trajectories(trajs, pad_id=0)
    assert batch.valid.tolist() == [False, False, False, True]
    assert batch.group.tolist() == [-1, -1, -1, 0]  # its own group: -1 - episode


def test_a_misaligned_prior_sample_is_named():
    traj = episode(TURNS_A, [0.0, 0.0, 1.0], split=True)
    traj.prior_samples[1].action_mask.pop()
    with pytest.raises(TrajectoryShapeError, match="trajectory 0, sample 1: action_mask has 4 entries"):
        collate_trajectories([traj], pad_id=0)


def test_unsplit_batches_pass_through_untouched():
    """Rows are episodes: the per-episode steps return their very inputs, so losses are bit for
    bit those of rows = episodes (and the advantage is today's formula)."""
    batch = collate_trajectories(group_of_two(split_a=False), pad_id=0)
    assert not batch.is_split and batch.episode.tolist() == [0, 1]
    assert batch.sample_weight.tolist() == [1.0, 1.0]
    x = torch.randn(2, 3)
    assert per_episode(x, batch) is x and to_rows(x, batch) is x
    present = x > 0
    assert merge_turns(x, present, batch) == (x, present)
    assert over_episodes(batch, lambda y: y, x) is x
    grpo = build_algorithm({"name": "grpo"})
    expected = group_normalize(batch.turn_rewards.sum(1, keepdim=True), torch.ones(2, 1, dtype=torch.bool), batch.group)
    assert torch.equal(grpo.advantages(batch, "trajectory"), expected.expand(batch.input_ids.shape) * batch.loss_mask)


def test_split_and_unsplit_episodes_in_one_group_share_one_advantage_each():
    split = collate_trajectories(group_of_two(split_a=True), pad_id=0)
    whole = collate_trajectories(group_of_two(split_a=False), pad_id=0)
    grpo = build_algorithm({"name": "grpo"})
    for granularity in ("trajectory", "turn"):
        per_token = grpo.advantages(split, granularity)
        reference = grpo.advantages(whole, granularity)
        assert _flat(_by_episode(per_token, split)) == pytest.approx(_flat(_by_episode(reference, whole)))
    # trajectory level: one advantage per episode, A's three rows alike, opposite to B's
    advantages = grpo.advantages(split, "trajectory")
    a_values = advantages[:3][split.loss_mask[:3]].unique()
    assert len(a_values) == 1 and float(a_values) == pytest.approx(0.25 / (0.25 + 1e-4), rel=1e-6)
    assert advantages[3][split.loss_mask[3]].unique().tolist() == pytest.approx([-0.25 / (0.25 + 1e-4)], rel=1e-6)


def _by_episode(per_token: torch.Tensor, batch) -> list[list[float]]:
    """Each episode's action-token values in order, its rows joined."""
    out: dict[int, list[float]] = {}
    for row in range(per_token.shape[0]):
        out.setdefault(int(batch.episode[row]), []).extend(per_token[row][batch.action_mask[row]].tolist())
    return [out[e] for e in sorted(out)]


def _flat(lists: list[list[float]]) -> list[float]:
    return [value for values in lists for value in values]


TOKEN_MEAN = [
    {"name": "grpo", "advantage_granularity": "trajectory"},
    {"name": "grpo", "advantage_granularity": "turn"},
    {"name": "cispo"},
    {"name": "llmreinforce", "advantage_granularity": "token"},
    {"name": "llmreinforce", "advantage_granularity": "turn"},
    {"name": "llmppo", "advantage_granularity": "token", "gae_lambda": 0.9, "gamma": 0.95},
    {"name": "llmppo", "advantage_granularity": "turn", "gae_lambda": 0.9},
]


@pytest.mark.parametrize("config", TOKEN_MEAN, ids=lambda c: "-".join(map(str, c.values())))
def test_a_split_episode_trains_its_tokens_exactly_as_unsplit(config):
    """The loss's gradient on every generated token (and PPO's value loss) is the same whether
    the episode is one row or three: splitting neither adds weight nor loses credit."""
    split_grads, split_loss = _token_gradients(config, split_a=True)
    whole_grads, whole_loss = _token_gradients(config, split_a=False)
    assert [len(g) for g in split_grads] == [len(g) for g in whole_grads]
    assert _flat(split_grads) == pytest.approx(_flat(whole_grads), rel=1e-5, abs=1e-7)
    assert split_loss == pytest.approx(whole_loss, rel=1e-5)
    assert any(abs(g) > 1e-6 for g in split_grads[0])  # the split episode is trained at all


def _token_gradients(config, *, split_a: bool):
    batch = collate_trajectories(group_of_two(split_a), pad_id=0)
    algorithm = build_algorithm({**config, "beta": 0.0})
    logprobs = (batch.old_logprobs * 0.9).requires_grad_(True)  # off the sampler's: ratios not 1
    # PPO's value before each token: a function of the token itself, so both layouts agree
    outputs = SimpleNamespace(values=(batch.input_ids.float() * 0.01).requires_grad_(True))
    loss, _ = algorithm.policy_loss(logprobs, outputs, batch, Correction(batch.loss_mask))
    loss.backward()
    return _by_episode(logprobs.grad, batch), loss.item()


def test_gspo_weighs_each_sample_by_its_share_of_the_episode():
    """GSPO averages per row: A's three rows weigh 1/3 each, so A weighs what B weighs."""
    batch = collate_trajectories(group_of_two(split_a=True), pad_id=0)
    gspo = build_algorithm({"name": "gspo"})
    objective = torch.tensor([1.0, 2.0, 3.0, 10.0])[:, None].expand(batch.input_ids.shape)
    loss = gspo.aggregate(objective, batch.loss_mask, batch.sample_weight)
    assert float(loss) == pytest.approx(((1 + 2 + 3) / 3 + 10) / 2)
    assert float(gspo.aggregate(objective, batch.loss_mask)) == pytest.approx((1 + 2 + 3 + 10) / 4)


def test_reinforce_baseline_counts_a_split_episode_once():
    trajs = [
        episode(TURNS_A, [0.0, 0.0, 1.0], split=True),
        episode(TURNS_B, [0.0, 0.0, 0.0], split=False),
        episode(TURNS_B, [0.0, 0.0, 0.5], split=False),
    ]
    batch = collate_trajectories(trajs, pad_id=0)
    algorithm = build_algorithm({"name": "llmreinforce", "advantage_granularity": "turn"})
    returns, episode_return = algorithm.returns(batch, "turn")
    baseline = to_rows(leave_one_out_mean(per_episode(episode_return, batch), per_episode(batch.group, batch)), batch)
    assert episode_return.tolist() == [1.0, 1.0, 1.0, 0.0, 0.5]
    assert baseline.tolist() == pytest.approx([0.25, 0.25, 0.25, 0.75, 0.5])


def test_micro_batches_keep_an_episode_whole():
    trajs = group_of_two(split_a=True) + [
        episode(TURNS_B, [1.0, 0.0, 0.0], split=True, group=1),
        episode(TURNS_A, [0.0, 0.0, 0.0], split=False, group=1),
    ]
    batch = collate_trajectories(trajs, pad_id=0)
    parts = split_rows(batch, 2)
    assert [count for count, _ in parts] == [2, 2]  # episodes: the trainer's share of each chunk
    assert [chunk.episode.tolist() for _, chunk in parts] == [[0, 0, 0, 1], [2, 2, 2, 3]]
    second = parts[1][1]
    assert second.episode_ends.tolist() == [2, 3] and second.group.tolist() == [1, 1, 1, 1]
