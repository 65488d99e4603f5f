"""The step loop both training entry points share (``loops.py``): one optimiser step per
batch through accelerate, and the bookkeeping around it: metrics rows, rollout records,
evaluation, weight pushes to a separate generator, checkpoints, and a Ctrl-C (or SIGTERM/SIGHUP)
that saves the last whole step before it stops.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agilerl.concurrency import stop_signals
from agilerl.manifest.settings import TrainingSettings
from agilerl.train.algorithm import Algorithm
from agilerl.train.checkpoint import checkpoint_dir, save_checkpoint
from agilerl.train.determinism import deterministic_algorithms
from agilerl.train.distributed import (
    World,
    build_accelerator,
    describe_engine,
    failed_together,
    merge_over_ranks,
    prepare_reference,
    run_agreed,
)
from agilerl.train.metrics import MetricsLog, ProgressBar, combine_metrics, plot_curves
from agilerl.train.run_dir import mark_run
from agilerl.train.tracking import Tracking, run_config

if TYPE_CHECKING:
    import torch

    from agilerl.generation.backends import WeightSyncedPolicy
    from agilerl.generation.versioned import VersionedPolicy
    from agilerl.train.records import RolloutRecorder

__all__ = ["TrainResult", "Trainer", "split_rows", "build_optimizer", "by_rank"]


@dataclass
class TrainResult:
    """Where a run ended: its step count, files, and the last metrics logged.

    Only rank 0 writes files; on other ranks ``plot`` and ``checkpoint`` are None.
    """

    step: int
    interrupted: bool
    output_dir: Path
    checkpoint: Path | None
    plot: Path | None
    metrics: dict[str, float]
    rank: int = 0


class Trainer:
    """The part both loops share: one optimiser step per batch, bookkeeping around it."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        algorithm: Algorithm[Any],
        settings: TrainingSettings,
        resume_from: str | Path | None,
        show_progress: bool,
    ) -> None:
        import torch

        from agilerl.train.checkpoint import read_state, restore_training_state
        from agilerl.train.reference import frozen_reference

        self.model, self.tokenizer, self.algorithm, self.settings = model, tokenizer, algorithm, settings
        # training.report_to: accelerate's trackers go into the accelerator; a resume continues their run
        self.tracking = Tracking(settings, start_step=int(read_state(resume_from)["step"]) if resume_from else 0)
        self.accelerator = accelerator = build_accelerator(settings, log_with=self.tracking.trackers)
        self.world = World(rank=accelerator.process_index, world_size=accelerator.num_processes)
        self.engine = describe_engine(accelerator)
        self.device = accelerator.device
        # The reference is copied before the policy is wrapped or sharded (with LoRA no copy:
        # the adapters switched off), then placed, and under FSDP2 sharded, like the policy.
        reference = frozen_reference(model) if algorithm.needs_reference else None
        policy = algorithm.prepare_policy(model)
        params = [p for p in policy.parameters() if p.requires_grad]
        optimizer = build_optimizer(params, lr=settings.lr, weight_decay=settings.weight_decay)
        self.policy, self.optimizer = accelerator.prepare(policy, optimizer)
        self.bare_policy = accelerator.unwrap_model(self.policy)  # no DDP wrapper: rank-0-only calls
        self.reference = prepare_reference(accelerator, reference) if reference is not None else None
        self.step = 0
        if resume_from is not None:
            self.step = restore_training_state(resume_from, accelerator)
        torch.manual_seed(settings.seed * 1_000_003 + self.step * 101 + self.world.rank)
        self.output_dir = Path(settings.output_dir)
        self.show_progress = show_progress and self.world.is_main
        self.log = MetricsLog(self.output_dir, start_step=self.step) if self.world.is_main else None
        if self.world.is_main:
            mark_run(self.output_dir)  # the folder is recognisably this run's (for --overwrite)
        self._shielding = False
        self._pending_interrupt = False
        self.synced: WeightSyncedPolicy | None = None  # a policy with its own weights, pushed each step
        self.versioned: VersionedPolicy | None = None  # what generates: told each step's version (and weights)
        self.rollout_state: Callable[[], dict[str, Any]] | None = None  # the task stream, kept in checkpoints
        self.rollouts_trained: Callable[[], None] | None = None  # told when an update has used its batches
        self.records: RolloutRecorder | None = None  # rollouts.jsonl, written with each step's row
        self._unlogged: dict[str, float] | None = None  # a finished step's metrics, until its row is written
        self.env_placement: str | None = None  # where the env runs, on the header beside the engine
        self._saved_step, self._saved_at = self.step, time.monotonic()

    def run(
        self,
        next_batch: Callable[[], tuple[Any, dict[str, float]]],
        evaluate: Callable[[], dict[str, float]],
        *,
        curves: tuple[str, str],
        plot_name: str,
    ) -> TrainResult:
        settings = self.settings
        start = self.step
        last: dict[str, float] = {}
        checkpoint: Path | None = None
        interrupted = False
        bar = ProgressBar(settings.max_steps, start, show=self.show_progress, lines=self.world.is_main)
        header: dict[str, Any] = {"engine": self.engine}  # on this run's first metrics row
        if self.world.is_main:  # the run's first lines: which engine trains, where the env runs
            print(f"engine: {self.engine}", file=sys.stderr, flush=True)
            if self.env_placement is not None:
                print(f"env: {self.env_placement}", file=sys.stderr, flush=True)
        config = run_config(settings, self.algorithm, self.engine)
        with self.tracking.running(self.accelerator, config), bar.running(), self._graceful_interrupt(), \
                deterministic_algorithms(settings.deterministic, self.accelerator.device):
            try:
                if start == 0 and settings.evaluation_interval:
                    last = evaluate()  # the untrained baseline: where the curve starts
                    if self.log is not None:
                        self.log.write(0, last, header)
                        header = {}
                    self.tracking.log(0, last)
                    bar.update(0, last)
                while self.step < settings.max_steps:
                    t0 = time.perf_counter()
                    # a rank whose collection failed stops every rank here, so they save together
                    batches, metrics = run_agreed(self.accelerator, lambda: self._collect(next_batch))
                    with self._shielded():  # from here to the log line, Ctrl-C waits
                        if self.synced is not None and settings.rollout_mode == "sync":
                            self.synced.sleep()  # its memory is the update's (async: it generates on)
                        metrics.update(self._update(batches))
                        if self.rollouts_trained is not None:  # their tasks count as trained from here
                            self.rollouts_trained()
                        self._unlogged = metrics  # the step is taken: its row is owed from here on
                        metrics.update(self._push_weights())
                        metrics["time/step_s"] = time.perf_counter() - t0
                        last = self._unlogged = merge_over_ranks(self.accelerator, metrics)
                        solved = False
                        if self._due(settings.evaluation_interval):
                            last.update(run_agreed(self.accelerator, evaluate))  # rank 0's failure is everyone's
                            solved = self._reached_target(last)
                        self._log_step(header)
                        header = {}
                        bar.update(self.step, last)
                        if solved:
                            bar.log(f"eval reward reached stop_at_eval_reward {settings.stop_at_eval_reward}: "
                                    f"stopping at step {self.step}")  # rank 0's reward: others hold none
                            break
                        if self._checkpoint_due():
                            checkpoint = self._save()
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: every rank got it, so all save together
                interrupted = True
                bar.log(f"interrupted: saving a checkpoint at step {self.step}")
            except BaseException as exc:
                self._save_on_failure(exc, header)
                raise
            self._shielding = True  # the last save is never cut in half by a Ctrl-C
            if self.step > self._saved_step:
                checkpoint = self._save()
            elif interrupted and self.world.is_main:  # this step is saved already (or was never taken):
                saved = checkpoint_dir(self.output_dir, self.step)  # never delete it to write it again
                checkpoint = saved if saved.is_dir() else None
            plot = None  # still shielded: a Ctrl-C inside matplotlib's import would surface as another error
            if self.log is not None:
                plot = plot_curves(self.log.path, self.output_dir / plot_name, curves, title=type(self.algorithm).__name__)
                mark_run(self.output_dir)  # the plot is the run's too
        return TrainResult(self.step, interrupted, self.output_dir, checkpoint, plot, last, self.world.rank)

    def _collect(self, next_batch: Callable[[], tuple[Any, dict[str, float]]]) -> tuple[list[Any], dict[str, float]]:
        """The step's ``gradient_accumulation_steps`` batches, and their collection metrics as one row
        (``combine_metrics``: counts summed, maxima the largest, the rest averaged)."""
        batches, parts = [], []
        for _ in range(self.settings.gradient_accumulation_steps):
            batch, metrics = next_batch()
            batches.append(batch)
            parts.append(metrics)
        return batches, combine_metrics(parts)

    def _update(self, batches: list[Any]) -> dict[str, float]:
        """One optimiser step over the step's batches, accumulating gradients over micro-batches;
        gradients are synchronised across processes on the last backward pass only."""
        accelerator = self.accelerator
        self.policy.train()
        self.optimizer.zero_grad(set_to_none=True)
        pieces: list[tuple[Any, float]] = []  # (micro-batch, its share of the step's loss)
        for batch in batches:
            parts = split_rows(batch, self.settings.micro_batch_size)
            total = sum(rows for rows, _ in parts)
            pieces += [(chunk, rows / total / len(batches)) for rows, chunk in parts]
        loss_sum = 0.0
        metrics: dict[str, float] = {}
        for index, (chunk, weight) in enumerate(pieces):
            last = index == len(pieces) - 1
            with contextlib.nullcontext() if last else accelerator.no_sync(self.policy):
                loss, chunk_metrics = self.algorithm.loss(self.policy, chunk, self.reference)
                accelerator.backward(loss * weight)
            loss_sum += float(loss.detach()) * weight
            for key, value in chunk_metrics.items():
                metrics[key] = metrics.get(key, 0.0) + value * weight
        if self.settings.max_grad_norm is not None:
            norm = accelerator.clip_grad_norm_(self.policy.parameters(), self.settings.max_grad_norm)
            metrics["grad_norm"] = float(norm)
        self.optimizer.step()
        self.step += 1
        out = {f"algo/{k}": v for k, v in metrics.items()}
        out["train/loss"] = loss_sum
        return out

    def _push_weights(self) -> dict[str, float]:
        """The new version, with the updated weights for a synced policy (every rank's, whole:
        under FSDP2 each rank gathers them), between two generations; the push costs
        ``time/weight_sync_s``."""
        if self.versioned is None:
            return {}
        if self.synced is None:
            self.versioned.publish(self.step)
            return {}
        from agilerl.generation.weights import hf_weights

        t0 = time.perf_counter()
        self.versioned.publish(self.step, hf_weights(self.model))
        return {"time/weight_sync_s": time.perf_counter() - t0}

    def _reached_target(self, metrics: dict[str, float]) -> bool:
        """Whether this evaluation reached ``stop_at_eval_reward``: rank 0 evaluates, so its
        verdict is every rank's (one small broadcast), and all stop at the same step."""
        target = self.settings.stop_at_eval_reward
        if target is None:
            return False
        reached = self.world.is_main and metrics.get("eval/reward", float("-inf")) >= target
        if self.accelerator.num_processes == 1:
            return reached
        import torch

        flags = self.accelerator.gather(torch.tensor([float(reached)], device=self.accelerator.device))
        return bool(flags.cpu().tolist()[0])

    def _due(self, interval: int) -> bool:
        return interval > 0 and (self.step % interval == 0 or self.step == self.settings.max_steps)

    def _log_step(self, header: dict[str, Any]) -> None:
        """The finished step's row (metrics.jsonl, trackers): written before its checkpoint, so
        a checkpoint never exists without its row."""
        if self.records is not None:  # the step's samples, before its row
            self.records.write(self.step)
        if self.log is not None:
            self.log.write(self.step, self._unlogged or {}, header)
        self.tracking.log(self.step, self._unlogged or {})
        self._unlogged = None

    def _checkpoint_due(self) -> bool:
        """Every ``checkpoint_interval`` steps or ``checkpoint_minutes`` (all ranks agree: one
        late rank is enough); never on the last step, whose save follows the loop."""
        settings = self.settings
        if self.step >= settings.max_steps:
            return False
        if self._due(settings.checkpoint_interval):
            return True
        if settings.checkpoint_minutes is None:
            return False
        late = time.monotonic() - self._saved_at >= settings.checkpoint_minutes * 60
        return merge_over_ranks(self.accelerator, {"late": float(late)})["late"] > 0

    def _save(self) -> Path | None:
        """Every rank takes part (a sharded state is saved by all); rank 0 gets the path."""
        state: dict[str, Any] = {"algorithm": type(self.algorithm).__name__, "engine": self.engine}
        if self.rollout_state is not None:  # each rank's task stream, by rank
            state["rollout"] = by_rank(self.accelerator, self.rollout_state())
        path = save_checkpoint(
            self.output_dir, self.step, accelerator=self.accelerator, model=self.model,
            tokenizer=self.tokenizer, policy=self.policy,
            state=state,
            keep_last=self.settings.keep_last,
        )
        self._saved_step, self._saved_at = self.step, time.monotonic()
        if self.world.is_main:
            mark_run(self.output_dir)  # trackers' folders appear during the run
        return path if self.world.is_main else None

    def _save_on_failure(self, exc: BaseException, header: dict[str, Any]) -> None:
        """A run that fails keeps its last whole step: the step's row if the failure came after
        the update (an evaluation that raised), then its checkpoint. With several processes the
        save is collective: it runs when every rank stopped at the same point (a collection or an
        evaluation that failed: ``run_agreed``); a failure elsewhere (inside the update) stops
        this rank alone, the launcher stops the others, and the last periodic checkpoint stands."""
        if self.world.world_size > 1 and not failed_together(exc):
            exc.add_note(f"the last checkpoint saved before the failure is the one to resume from ({self.output_dir})")
            return
        self._shielding = True  # a Ctrl-C now would cut the save in half
        try:
            if self._unlogged is not None:
                self._log_step(header)
            if self.step > self._saved_step:
                path = self._save()
                exc.add_note(f"the last whole step, {self.step}, is saved in {path}; resume from it")
        except Exception as save_error:  # noqa: BLE001 - the first failure is the one to report
            exc.add_note(f"saving the last step failed too: {type(save_error).__name__}: {save_error}")

    @contextmanager
    def _graceful_interrupt(self) -> Iterator[None]:
        """Ctrl-C (or SIGTERM: a scheduler's preemption; SIGHUP: a closed terminal) during
        collection stops at once; inside ``_shielded`` (the update and its bookkeeping) it waits
        until the step is whole and logged, so the checkpoint saved on the way out is never half
        a step. After the first, the next signals of a burst wait too: the save is never cut."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, frame: Any) -> None:
            if self._shielding:
                self._pending_interrupt = True
            else:
                self._shielding = True  # the next of a burst of Ctrl-Cs waits: the way out saves
                raise KeyboardInterrupt

        # SIGHUP: the terminal or ssh session closed; stop and save as for the other two (not under nohup)
        previous = {signum: signal.signal(signum, handler) for signum in stop_signals()}
        try:
            yield
        finally:
            for signum, before in previous.items():
                signal.signal(signum, before)

    @contextmanager
    def _shielded(self) -> Iterator[None]:
        self._shielding = True
        try:
            yield
        finally:
            self._shielding = False
        if self._pending_interrupt:
            self._shielding = True  # as in the handler: a burst never cuts the save that follows
            raise KeyboardInterrupt


def split_rows(batch: Any, size: int | None) -> list[tuple[int, Any]]:
    """``(rows, micro_batch)`` pairs of at most ``size`` rows: a ``RolloutTensors`` or a dict of
    tensors cut along the first dimension. Rollout rows are in group order, so cuts at
    multiples of the group size keep every group whole (its advantages stay right)."""
    from dataclasses import fields, is_dataclass, replace

    if hasattr(batch, "micro_batches"):  # RolloutTensors: whole episodes (an episode may be several rows)
        return batch.micro_batches(size)
    tensors = {f.name: getattr(batch, f.name) for f in fields(batch)} if is_dataclass(batch) else batch
    rows = next(iter(tensors.values())).shape[0]
    if size is None or size >= rows:
        return [(rows, batch)]
    chunks = []
    for start in range(0, rows, size):
        part = {k: v[start : start + size] if v is not None else None for k, v in tensors.items()}
        chunk = replace(batch, **part) if is_dataclass(batch) else part
        chunks.append((min(size, rows - start), chunk))
    return chunks


def build_optimizer(params: list[Any], *, lr: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """AdamW, fused into one kernel where the device supports it (4x faster steps on CPU)."""
    import torch

    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, ValueError):  # a device or dtype without the fused kernel
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def by_rank(accelerator: Any, value: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``value``, in rank order (a collective: every rank calls it)."""
    if accelerator.num_processes == 1:
        return [value]
    from accelerate.utils import gather_object

    return list(gather_object([value]))


