"""Versioned generation: every generated token knows the weights that produced it.

``VersionedPolicy`` wraps any :class:`Policy`. Its ``generate`` stamps each ``Generation`` with
the policy version (the optimiser steps taken by the weights it ran), and ``publish`` moves the
weights and the version forward together, between two generate calls, never during one. Calls
made at once from several threads (the async pipeline's lanes, one group each) are coalesced
into one batched call of the wrapped policy, as a server batches its requests.

``InferenceCopy`` is the transformers backend's generator in async mode: a separate copy of the
trainer's weights (one more copy of the weights in memory, nothing else: no gradients, no
optimiser state), so generation goes on while the optimiser updates the trainer's own copy.

    policy = VersionedPolicy(InferenceCopy.of(model, tokenizer), version=0)
    policy.generate(prompts, params)[0].version  # 0
    policy.publish(1, hf_weights(model))        # between generations; then version 1
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agilerl.errors import CollectionError
from agilerl.generation.policy import Generation, Policy, SamplingParams, TransformersPolicy

if TYPE_CHECKING:
    import torch

__all__ = ["VersionedPolicy", "InferenceCopy"]


@dataclass
class _Request:
    prompts: list[Sequence[int]]
    params: SamplingParams
    result: list[Generation] = field(default_factory=list)
    error: BaseException | None = None
    done: bool = False


class VersionedPolicy:
    """A policy whose generations carry their version; concurrent calls share one batch."""

    def __init__(self, policy: Policy, *, version: int = 0, publish_timeout_s: float = 900.0) -> None:
        self.policy = policy
        self.version = version
        self.publish_timeout_s = publish_timeout_s  # how long a push waits for a running generate call
        self.max_model_len: int | None = getattr(policy, "max_model_len", None)
        self.calls = 0  # batched calls of the wrapped policy
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._busy = False
        self._listeners: list[Callable[[], None]] = []

    def on_publish(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` after each publish: a version that moved may let waiting work start
        (the async pipeline's lanes, held by the staleness bound). Returns what removes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Complete ``prompts``; a call made while another runs joins the next batch."""
        request = _Request(list(prompts), params)
        with self._cond:
            self._pending.append(request)
            while self._busy and not request.done:
                self._cond.wait()  # the running call ends (its own bound: the pipeline's stall check)
            if request.done:
                return _outcome(request)
            self._busy = True
            batch = [r for r in self._pending if r.params == params]
            self._pending = [r for r in self._pending if r.params != params]
            version = self.version
        try:
            flat = [p for r in batch for p in r.prompts]
            out = self.policy.generate(flat, params) if flat else []
            self.calls += 1
            if len(out) != len(flat):  # the collector names the contract; keep the count honest here
                raise ValueError(f"{type(self.policy).__name__}.generate returned {len(out)} completions for {len(flat)} prompts")
            start = 0
            for r in batch:
                r.result = out[start : start + len(r.prompts)]
                start += len(r.prompts)
                for generation in r.result:
                    generation.version = version
        except BaseException as exc:  # every caller of the batch sees it
            for r in batch:
                r.error = exc
        finally:
            with self._cond:
                for r in batch:
                    r.done = True
                self._busy = False
                self._cond.notify_all()
        return _outcome(request)

    def publish(self, version: int, weights: Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """From the next generate call on: ``weights`` (into a policy holding its own copy) and
        ``version``. Waits for a running call to end, never cuts one in half; one that runs past
        ``publish_timeout_s`` (a hung generator) is a ``CollectionError`` naming it."""
        deadline = time.monotonic() + self.publish_timeout_s
        with self._cond:
            while self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CollectionError(
                        f"the weight push to version {version} waited {self.publish_timeout_s:.0f} s "
                        f"(publish_timeout_s) for a running {type(self.policy).__name__}.generate call "
                        "to end: the generator hangs. The last checkpoint is the one to resume from."
                    )
                self._cond.wait(timeout=left)
            self._busy = True
        try:
            if weights is not None:
                self.policy.load_weights(weights)  # type: ignore[attr-defined]
            self.version = version
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
        for listener in tuple(self._listeners):  # a pipeline may close (and unsubscribe) meanwhile
            listener()


def _outcome(request: _Request) -> list[Generation]:
    if request.error is not None:
        raise request.error
    return request.result


class InferenceCopy(TransformersPolicy):
    """A ``TransformersPolicy`` on its own copy of the trainer's weights (a ``WeightSyncedPolicy``):
    the trainer pushes the updated weights with ``load_weights`` after each optimiser step."""

    @classmethod
    def of(cls, model: Any, tokenizer: Any, *, max_model_len: int | None = None) -> InferenceCopy:
        """A copy of ``model`` (a Hugging Face model, a peft model around one, or one sharded by
        FSDP2: its weights are gathered whole, LoRA merged) built from its config."""
        import torch

        from agilerl.generation.weights import hf_weights

        weights = hf_weights(model)
        get_base = getattr(model, "get_base_model", None)
        base = get_base() if callable(get_base) else model
        device = weights[0][1].device if weights else torch.device("cpu")
        dtype = weights[0][1].dtype if weights else None
        with torch.device(device):  # built whole (buffers such as rotary tables included), then loaded
            copy = type(base)(base.config)
        if dtype is not None:
            copy = copy.to(dtype)
        copy.load_state_dict(dict(weights), strict=False)
        copy.tie_weights()
        copy.requires_grad_(False)
        copy.eval()
        return cls(copy, tokenizer, max_model_len=max_model_len)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy ``weights`` into the copy, in place (no new memory)."""
        import torch

        params = dict(self.model.state_dict())
        with torch.no_grad():
            for name, tensor in weights:
                target = params.get(name)
                if target is not None:
                    target.copy_(tensor)

    def sleep(self) -> None:
        """Nothing to free: the copy keeps generating while the trainer updates."""

    @property
    def nbytes(self) -> int:
        """What the copy costs in memory: its weights (tied ones once)."""
        seen: set[int] = set()
        total = 0
        for tensor in self.model.state_dict().values():
            if tensor.data_ptr() not in seen:
                seen.add(tensor.data_ptr())
                total += tensor.numel() * tensor.element_size()
        return total
