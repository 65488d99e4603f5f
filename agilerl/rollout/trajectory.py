"""What one rollout yields: the token stream training consumes, and how it was scored."""

from __future__ import annotations

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

    @property
    def num_turns(self) -> int:
        return len(self.rewards)

    @property
    def total_reward(self) -> float:
        return float(sum(self.rewards))
