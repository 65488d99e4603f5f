"""Advantage estimation over collated rollouts: group-relative, GAE and returns.

Every function is a pure tensor function, so each one is checked against hand-computed values.
Shapes: ``[B]`` per row, ``[B, K]`` per turn, ``[B, T]`` per token; ``[E]`` per episode.

A row is a training sample; an episode whose context was rewritten spans several rows
(``RolloutTensors.episode``). Whatever compares or accumulates over an episode (group statistics,
baselines, returns, GAE) runs per episode: ``per_episode`` takes one row of each, ``to_rows``
broadcasts back, ``merge_turns`` joins the turns an episode's rows hold, and ``over_episodes``
runs a scan along an episode's tokens with its rows joined end to end. A batch without split
episodes passes through all four untouched, so its numbers are exactly those of rows = episodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from agilerl.train.logprobs import masked_mean

if TYPE_CHECKING:
    from agilerl.train.batch import RolloutTensors

__all__ = [
    "per_episode",
    "to_rows",
    "merge_turns",
    "over_episodes",
    "group_normalize",
    "has_per_turn_rewards",
    "is_multi_turn",
    "per_turn_to_tokens",
    "turn_action_bounds",
    "rewards_at_turn_ends",
    "gae",
    "discounted_returns",
    "leave_one_out_mean",
    "whiten",
]


def per_episode(values: torch.Tensor, batch: RolloutTensors) -> torch.Tensor:
    """``values`` (``[B, ...]``, the same on every row of an episode) with one row per episode."""
    return values[batch.episode_ends] if batch.is_split else values


def to_rows(values: torch.Tensor, batch: RolloutTensors) -> torch.Tensor:
    """Per-episode ``values`` (``[E, ...]``) given to every row of their episode (``[B, ...]``)."""
    return values[batch.episode_of] if batch.is_split else values


def merge_turns(
    values: torch.Tensor, present: torch.Tensor, batch: RolloutTensors
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-turn ``values`` ``[B, K]`` that each turn has in the one row holding it (``present``)
    as ``[E, K]``, with where they are present."""
    if not batch.is_split:
        return values, present
    of, episodes = batch.episode_of, len(batch.episode_ends)
    merged = values.new_zeros((episodes, values.shape[1])).index_add(0, of, values * present)
    count = present.new_zeros((episodes, values.shape[1]), dtype=torch.long).index_add(0, of, present.long())
    return merged, count > 0


def over_episodes(
    batch: RolloutTensors, scan: Callable[..., torch.Tensor], *per_token: torch.Tensor
) -> torch.Tensor:
    """``scan(*per_token)`` (``[B, T]`` tensors in, ``[B, T]`` out: returns, GAE) run along each
    episode's tokens, its rows joined end to end, so what a later sample earns reaches the
    earlier samples' tokens; the result is cut back into rows (0 on padding)."""
    if not batch.is_split:
        return scan(*per_token)
    of = batch.episode_of
    lengths = batch.attention_mask.sum(dim=1)
    starts = torch.cumsum(lengths, 0) - lengths  # each row's start, counted over the whole batch
    offsets = starts - starts[batch.episode_starts][of]
    width = int(torch.zeros_like(lengths).index_add(0, of, lengths).max())
    positions = torch.arange(batch.input_ids.shape[1], device=of.device).expand_as(batch.input_ids)
    real = positions < lengths[:, None]
    columns = torch.where(real, offsets[:, None] + positions, width)  # padding: one spare column
    episodes = of[:, None].expand_as(columns)
    joined = []
    for x in per_token:
        laid = x.new_zeros((len(batch.episode_ends), width + 1))
        laid[episodes[real], columns[real]] = x[real]
        joined.append(laid)
    out = scan(*joined)
    return torch.where(real, out[episodes, columns], torch.zeros((), dtype=out.dtype, device=out.device))


def group_normalize(
    values: torch.Tensor,
    mask: torch.Tensor,
    group: torch.Tensor,
    *,
    epsilon: float = 1e-4,
    scale: bool = True,
) -> torch.Tensor:
    """``(v - mean) / (std + epsilon)`` per (group, column) over the masked members.

    ``values``/``mask`` are ``[B, K]``; ``group`` is ``[B]``. The std is the population std, so a
    group of one is defined; a group whose members all scored the same gets exactly zero (it
    carries no signal). Masked-out entries come back as 0.
    """
    _, member_of = torch.unique(group, return_inverse=True)
    num_groups = int(member_of.max()) + 1
    weights = mask.to(values.dtype)

    def per_group(x: torch.Tensor, reduce: str = "sum", fill: float = 0.0) -> torch.Tensor:
        out = values.new_full((num_groups, values.shape[1]), fill)
        return out.scatter_reduce(0, member_of[:, None].expand_as(x), x, reduce)

    count = per_group(weights).clamp(min=1.0)
    mean = (per_group(values * weights) / count)[member_of]
    centered = (values - mean) * weights
    if scale:
        std = (per_group(centered**2) / count).sqrt()[member_of]
        centered = centered / (std + epsilon)
    high = per_group(values.masked_fill(~mask, float("-inf")), "amax", float("-inf"))
    low = per_group(values.masked_fill(~mask, float("inf")), "amin", float("inf"))
    return torch.where((high > low)[member_of], centered, torch.zeros_like(centered))


def has_per_turn_rewards(batch: RolloutTensors) -> bool:
    """True when some rollout is rewarded before its last turn (rewards are not only final)."""
    early = batch.turn_mask[:, :-1] & batch.turn_mask[:, 1:]
    return bool((batch.turn_rewards[:, :-1][early] != 0).any())


def is_multi_turn(batch: RolloutTensors) -> bool:
    """True when some rollout in the batch played more than one turn."""
    return bool((batch.turn_mask.sum(dim=1) > 1).any())


def per_turn_to_tokens(per_turn: torch.Tensor, turn_ids: torch.Tensor) -> torch.Tensor:
    """Give every token its turn's value (``[B, K]`` -> ``[B, T]``); 0 outside turns."""
    values = per_turn.gather(1, turn_ids.clamp(min=0))
    return torch.where(turn_ids >= 0, values, torch.zeros_like(values))


def turn_action_bounds(
    turn_ids: torch.Tensor, action_mask: torch.Tensor, num_turns: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """First and last action-token position per turn, ``[B, K]`` each; -1 for a turn without any."""
    length = turn_ids.shape[1]
    positions = torch.arange(length, device=turn_ids.device).expand_as(turn_ids)
    acting = action_mask & (turn_ids >= 0)
    index = turn_ids.clamp(min=0)
    first = torch.full(
        (turn_ids.shape[0], num_turns), length, dtype=torch.long, device=turn_ids.device
    ).scatter_reduce(1, index, torch.where(acting, positions, length), "amin")
    last = torch.full_like(first, -1).scatter_reduce(
        1, index, torch.where(acting, positions, -1), "amax"
    )
    return torch.where(first == length, -1, first), last


def rewards_at_turn_ends(batch: RolloutTensors) -> torch.Tensor:
    """Per-token rewards ``[B, T]``: each turn's reward on its last action token, 0 elsewhere."""
    _, last = turn_action_bounds(batch.turn_ids, batch.action_mask, batch.max_turns)
    placed = batch.turn_mask & (last >= 0)
    out = torch.zeros_like(batch.input_ids, dtype=batch.turn_rewards.dtype)
    return out.scatter_add(1, last.clamp(min=0), batch.turn_rewards * placed)


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """Generalised advantage estimation along dim 1, skipping unmasked steps; 0 where unmasked.

    The value after a row's last masked step is 0 (episodes end there).
    """
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(next_value)
    for step in range(rewards.shape[1] - 1, -1, -1):
        active = mask[:, step]
        delta = rewards[:, step] + gamma * next_value - values[:, step]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, step] = torch.where(active, advantage, 0.0)
        next_value = torch.where(active, values[:, step], next_value)
        next_advantage = torch.where(active, advantage, next_advantage)
    return advantages


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Reward-to-go along dim 1 over masked steps (GAE with zero values and lambda 1)."""
    return gae(rewards, torch.zeros_like(rewards), mask, gamma, 1.0)


def leave_one_out_mean(values: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Each rollout's baseline: the mean of the *other* members of its group (0 if alone)."""
    _, member_of = torch.unique(group, return_inverse=True)
    sums = values.new_zeros(int(member_of.max()) + 1).index_add(0, member_of, values)
    counts = torch.bincount(member_of).to(values.dtype)[member_of]
    others = (sums[member_of] - values) / (counts - 1).clamp(min=1.0)
    return torch.where(counts > 1, others, torch.zeros_like(values))


def whiten(values: torch.Tensor, mask: torch.Tensor, epsilon: float = 1e-8) -> torch.Tensor:
    """Shift and scale the masked entries to mean 0, std 1 (PPO's advantage normalisation)."""
    mean = masked_mean(values, mask)
    std = masked_mean((values - mean) ** 2, mask).sqrt()
    return (values - mean) / (std + epsilon) * mask
