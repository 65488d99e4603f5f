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

    A row is one training sample. An episode whose context was rewritten is several rows
    (``Trajectory.samples``, consecutive, oldest first): ``episode`` ``[B]`` is each row's episode
    (0..E-1, None: every row its own), and every row of an episode carries the episode's
    ``turn_rewards``, ``turn_mask``, ``group`` and ``valid``; its ``turn_ids`` are the episode's
    turn indices, so each turn's tokens sit in one row. Advantages are computed per episode
    (``episode_ends`` picks one row of each) and broadcast to its rows; ``sample_weight`` ``[B]``
    (``1 / samples of the episode``) is each row's share of its episode, for losses that average
    per row (docs/training.md, "Split episodes").
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
    episode: torch.Tensor | None = None
    sample_weight: torch.Tensor | None = None

    @property
    def is_split(self) -> bool:
        """True when some episode spans several rows (otherwise rows are episodes)."""
        return self.episode is not None and len(self.episode) > 1 and bool(
            (self.episode[1:] == self.episode[:-1]).any()
        )

    @property
    def episode_of(self) -> torch.Tensor:
        """Each row's episode as ``0..E-1`` in row order ``[B]`` (whatever ``episode`` numbers)."""
        import torch

        if self.episode is None:
            return torch.arange(self.input_ids.shape[0], device=self.input_ids.device)
        return torch.unique_consecutive(self.episode, return_inverse=True)[1]

    @property
    def episode_ends(self) -> torch.Tensor:
        """The last row of each episode ``[E]``: index a per-row tensor with it for per-episode
        values (every row of an episode holds the same rewards, group and validity)."""
        import torch

        rows = self.input_ids.shape[0]
        of = self.episode_of
        last = torch.ones(rows, dtype=torch.bool, device=of.device)
        last[:-1] = of[1:] != of[:-1]
        return last.nonzero().squeeze(1)

    @property
    def episode_starts(self) -> torch.Tensor:
        """The first row of each episode ``[E]``."""
        ends = self.episode_ends
        import torch

        return torch.cat([ends.new_zeros(1), ends[:-1] + 1])

    def micro_batches(self, size: int | None) -> list[tuple[int, RolloutTensors]]:
        """``(episodes, chunk)`` pairs of at most ``size`` episodes each (all their rows), so an
        episode's samples, like a group's episodes, are never cut apart."""
        ends = self.episode_ends
        if size is None or size >= len(ends):
            return [(len(ends), self)]
        chunks = []
        for start in range(0, len(ends), size):
            first = 0 if start == 0 else int(ends[start - 1]) + 1
            stop = int(ends[min(start + size, len(ends)) - 1]) + 1
            part = {f.name: value[first:stop] for f in fields(self) if (value := getattr(self, f.name)) is not None}
            chunks.append((min(size, len(ends) - start), replace(self, **part)))
        return chunks

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
    """Pad ``trajectories`` into one :class:`RolloutTensors` (right padding with ``pad_id``): one
    row per training sample (``Trajectory.samples``), an episode's rows consecutive."""
    import torch

    if not trajectories:
        raise InvalidArgument("collate_trajectories needs at least one trajectory.")
    for index, traj in enumerate(trajectories):
        _check_lengths(index, traj)
    rows = [(episode, traj, sample) for episode, traj in enumerate(trajectories) for sample in traj.samples]
    batch = len(rows)
    length = max(1, max(len(sample.token_ids) for _, _, sample in rows))
    turns = max(max(t.num_turns, max(s.turn_ids, default=-1) + 1) for _, t, s in rows)
    turns = max(1, turns)
    with_logprobs = all(sample.logprobs is not None for _, _, sample in rows)

    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, length), dtype=torch.long)
    action_mask = torch.zeros((batch, length), dtype=torch.bool)
    turn_ids = torch.full((batch, length), -1, dtype=torch.long)
    old_logprobs = torch.zeros((batch, length)) if with_logprobs else None
    turn_rewards = torch.zeros((batch, turns))
    turn_mask = torch.zeros((batch, turns), dtype=torch.bool)
    for row, (_, traj, sample) in enumerate(rows):
        n, k = len(sample.token_ids), traj.num_turns
        input_ids[row, :n] = torch.tensor(sample.token_ids, dtype=torch.long)
        attention_mask[row, :n] = 1
        action_mask[row, :n] = torch.tensor(sample.action_mask, dtype=torch.bool)
        turn_ids[row, :n] = torch.tensor(sample.turn_ids, dtype=torch.long)
        if old_logprobs is not None:
            old_logprobs[row, :n] = torch.tensor(sample.logprobs, dtype=torch.float)
        turn_mask[row, :k] = True
        if traj.error is None:
            turn_rewards[row, :k] = torch.tensor(traj.rewards, dtype=torch.float)
    media = None
    if any(sample.media is not None for _, _, sample in rows):
        from agilerl.generation.media import BatchMedia

        media = BatchMedia.collate([sample.media for _, _, sample in rows], input_ids, action_mask, pad_id)
    return RolloutTensors(
        media=media,
        input_ids=input_ids,
        attention_mask=attention_mask,
        action_mask=action_mask,
        turn_ids=turn_ids,
        turn_rewards=turn_rewards,
        turn_mask=turn_mask,
        group=torch.tensor(
            [t.group if t.error is None else -1 - episode for episode, t, _ in rows], dtype=torch.long
        ),
        valid=torch.tensor([t.error is None for _, t, _ in rows], dtype=torch.bool),
        old_logprobs=old_logprobs,
        episode=torch.tensor([episode for episode, _, _ in rows], dtype=torch.long),
        sample_weight=torch.tensor([1.0 / len(t.samples) for _, t, _ in rows]),
    )


def _check_lengths(index: int, traj: Trajectory) -> None:
    split = len(traj.samples) > 1
    for number, sample in enumerate(traj.samples):
        _check_sample(f"trajectory {index}" + (f", sample {number}" if split else ""), traj, sample)


def _check_sample(where: str, traj: Trajectory, sample: Trajectory) -> None:
    n = len(sample.token_ids)
    lists: dict[str, Sequence[object]] = {
        "action_mask": sample.action_mask,
        "turn_ids": sample.turn_ids,
    }
    if sample.logprobs is not None:
        lists["logprobs"] = sample.logprobs
    for name, values in lists.items():
        if len(values) != n:
            raise TrajectoryShapeError(
                f"{where}: {name} has {len(values)} entries but token_ids has {n}; "
                "every per-token list must be aligned with token_ids."
            )
    if traj.error is None and max(sample.turn_ids, default=-1) >= traj.num_turns:
        raise TrajectoryShapeError(
            f"{where}: turn_ids reach turn {max(sample.turn_ids)} but rewards has "
            f"{traj.num_turns} entries; give one reward per turn."
        )
