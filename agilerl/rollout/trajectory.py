"""What one rollout yields: the token stream training consumes, and how it was scored."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agilerl.generation.media import VisionMedia

__all__ = ["Trajectory"]


@dataclass
class Trajectory:
    """One episode as tokens.

    ``token_ids`` is the whole conversation; ``action_mask`` is true on tokens the policy
    generated; ``turn_ids`` is the turn index of every token of that turn (the completion and the
    observation that answers it), -1 on the initial prompt; ``rewards`` has one entry per turn.
    ``logprobs`` (when the policy reports them) is aligned with ``token_ids``, 0.0 off the mask.
    ``versions`` (when the policy reports them) is aligned the same way: the policy version (the
    optimiser steps taken) of the weights that generated each token, -1 off the mask; an episode
    that spans a weight update carries both versions (docs/async.md).

    An episode whose context was rewritten (``context_policy: truncate | restart``, or an agent
    program that compacted its history) is several training samples: ``prior_samples`` holds the
    token streams it produced before its context was last rewritten, oldest first, each with its
    own ``token_ids``, ``action_mask``, ``turn_ids`` (the episode's turn indices), ``logprobs``,
    ``versions`` and ``media``; this object is the last sample and carries what belongs to the
    whole episode (``rewards`` per episode turn, ``terminated``/``truncated``/``error``/``info``,
    ``group``, ``seed``). Training computes one advantage per episode and gives it to every
    sample; splitting never adds weight: a token-mean loss counts each generated token once
    wherever it sits, and a per-sample mean weighs a sample ``1 / len(samples)``
    (docs/training.md, "Split episodes").
    """

    token_ids: list[int] = field(default_factory=list)
    action_mask: list[bool] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    logprobs: list[float] | None = None
    versions: list[int] | None = None
    group: int = 0
    seed: int | None = None
    row_index: int | None = None
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    media: VisionMedia | None = None
    """The images the episode showed and their processor tensors (a vision model's harness);
    None for a text model."""
    prior_samples: list[Trajectory] = field(default_factory=list)
    """The token streams this episode produced before its context was last rewritten, oldest
    first (only their per-token fields and ``media`` are meaningful); empty when it never was."""
    episode: str = field(default_factory=lambda: os.urandom(8).hex())
    """The episode's id, shared by all its samples (``split`` passes it on): what ties the
    records of ``rollouts.jsonl`` (docs/viewer.md) back to one episode. 16 random hex digits,
    drawn every episode: ``os.urandom`` costs a quarter of ``uuid4`` (0.5 against 2.1 us)."""

    @property
    def samples(self) -> list[Trajectory]:
        """Every training sample of the episode, oldest first: ``[*prior_samples, self]``."""
        return [*self.prior_samples, self]

    def split(self) -> Trajectory:
        """Close the current sample (moved to ``prior_samples``) and start an empty one.

        Called where the context is rewritten: what was generated so far keeps its exact tokens,
        and the next prompt is rendered fresh into this object's (now empty) token stream.
        Returns the closed sample.
        """
        closed = Trajectory(
            token_ids=self.token_ids,
            action_mask=self.action_mask,
            turn_ids=self.turn_ids,
            logprobs=self.logprobs,
            versions=self.versions,
            media=self.media,
            group=self.group,
            seed=self.seed,
            row_index=self.row_index,
            episode=self.episode,
        )
        self.prior_samples.append(closed)
        self.token_ids, self.action_mask, self.turn_ids = [], [], []
        self.logprobs = None if self.logprobs is None else []
        self.versions = None if self.versions is None else []
        self.media = None
        return closed

    @property
    def num_turns(self) -> int:
        return len(self.rewards)

    @property
    def total_reward(self) -> float:
        return float(sum(self.rewards))
