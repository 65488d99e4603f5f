"""Collating trajectories into the padded tensors every rollout algorithm reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from agilerl.errors import InvalidArgument, TrajectoryShapeError

if TYPE_CHECKING:
    import torch

    from agilerl.rollout.trajectory import Trajectory
    from agilerl.generation.media import BatchMedia

__all__ = ["RolloutTensors", "collate_trajectories"]


@dataclass
class RolloutTensors:
    """A batch of rollouts, right-padded to the longest one.

    Per token ``[B, T]``: ``input_ids``, ``attention_mask``, ``action_mask`` (policy tokens),
    ``turn_ids`` (-1 on the prompt and padding) and ``old_logprobs`` (the sampler's log-probs, or
    None when any trajectory lacks them: the off-policy correction's denominator). Per turn ``[B, K]``: ``turn_rewards`` and ``turn_mask``.
    Per rollout ``[B]``: ``group`` and ``valid`` (false for a failed rollout: it keeps its row but
    never enters the loss, and its group is its own, ``-1 - row``, so it leaves its group's
    statistics: the rollouts that finished are compared with each other only).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    turn_ids: torch.Tensor
    turn_rewards: torch.Tensor
    turn_mask: torch.Tensor
    group: torch.Tensor
    valid: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    media: BatchMedia | None = None
    """The rows' images (``pixel_values``, ...; ``agilerl.rollout.vision``), None without any."""

    @property
    def loss_mask(self) -> torch.Tensor:
        """Tokens the loss sees: the policy's own tokens of rollouts that did not fail."""
        return self.action_mask & self.valid[:, None]

    @property
    def max_turns(self) -> int:
        return self.turn_rewards.shape[1]

    def to(self, device: torch.device | str) -> RolloutTensors:
        """The same batch on ``device``."""
        moved = {
            f.name: value.to(device)
            for f in fields(self)
            if (value := getattr(self, f.name)) is not None
        }
        return replace(self, **moved)


def collate_trajectories(trajectories: Sequence[Trajectory], pad_id: int) -> RolloutTensors:
    """Pad ``trajectories`` into one :class:`RolloutTensors` (right padding with ``pad_id``)."""
    import torch

    if not trajectories:
        raise InvalidArgument("collate_trajectories needs at least one trajectory.")
    for index, traj in enumerate(trajectories):
        _check_lengths(index, traj)
    batch = len(trajectories)
    length = max(1, max(len(t.token_ids) for t in trajectories))
    turns = max(max(t.num_turns, max(t.turn_ids, default=-1) + 1) for t in trajectories)
    turns = max(1, turns)
    with_logprobs = all(t.logprobs is not None for t in trajectories)

    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, length), dtype=torch.long)
    action_mask = torch.zeros((batch, length), dtype=torch.bool)
    turn_ids = torch.full((batch, length), -1, dtype=torch.long)
    old_logprobs = torch.zeros((batch, length)) if with_logprobs else None
    turn_rewards = torch.zeros((batch, turns))
    turn_mask = torch.zeros((batch, turns), dtype=torch.bool)
    for row, traj in enumerate(trajectories):
        n, k = len(traj.token_ids), traj.num_turns
        input_ids[row, :n] = torch.tensor(traj.token_ids, dtype=torch.long)
        attention_mask[row, :n] = 1
        action_mask[row, :n] = torch.tensor(traj.action_mask, dtype=torch.bool)
        turn_ids[row, :n] = torch.tensor(traj.turn_ids, dtype=torch.long)
        if old_logprobs is not None:
            old_logprobs[row, :n] = torch.tensor(traj.logprobs, dtype=torch.float)
        turn_mask[row, :k] = True
        if traj.error is None:
            turn_rewards[row, :k] = torch.tensor(traj.rewards, dtype=torch.float)
    media = None
    if any(t.media is not None for t in trajectories):
        from agilerl.generation.media import BatchMedia

        media = BatchMedia.collate([t.media for t in trajectories], input_ids, action_mask, pad_id)
    return RolloutTensors(
        media=media,
        input_ids=input_ids,
        attention_mask=attention_mask,
        action_mask=action_mask,
        turn_ids=turn_ids,
        turn_rewards=turn_rewards,
        turn_mask=turn_mask,
        group=torch.tensor(
            [t.group if t.error is None else -1 - row for row, t in enumerate(trajectories)],
            dtype=torch.long,
        ),
        valid=torch.tensor([t.error is None for t in trajectories], dtype=torch.bool),
        old_logprobs=old_logprobs,
    )


def _check_lengths(index: int, traj: Trajectory) -> None:
    n = len(traj.token_ids)
    lists: dict[str, Sequence[object]] = {
        "action_mask": traj.action_mask,
        "turn_ids": traj.turn_ids,
    }
    if traj.logprobs is not None:
        lists["logprobs"] = traj.logprobs
    for name, values in lists.items():
        if len(values) != n:
            raise TrajectoryShapeError(
                f"trajectory {index}: {name} has {len(values)} entries but token_ids has {n}; "
                "every per-token list must be aligned with token_ids."
            )
    if traj.error is None and max(traj.turn_ids, default=-1) >= traj.num_turns:
        raise TrajectoryShapeError(
            f"trajectory {index}: turn_ids reach turn {max(traj.turn_ids)} but rewards has "
            f"{traj.num_turns} entries; give one reward per turn."
        )
