"""The engine under the loops: Hugging Face accelerate (one process, DDP, FSDP, DeepSpeed).

The loops stay ours; accelerate owns what it does well: the process group (``accelerate launch``
or ``torchrun`` describe it in the environment), device placement, wrapping the policy for DDP
or sharding it with FSDP, mixed precision, gradient synchronisation and sharded checkpoints.
Each rank collects its own share of tasks (``TaskAssigner`` with its rank); rank 0 alone logs,
evaluates and writes checkpoints, from accelerate's process info.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from agilerl.errors import ConfigError, RankFailed

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator
    from accelerate.tracking import GeneralTracker

    from agilerl.manifest.settings import TrainingSettings

__all__ = [
    "World",
    "current_world",
    "build_accelerator",
    "describe_engine",
    "merge_over_ranks",
    "run_agreed",
    "failed_together",
    "prepare_reference",
    "gathered_weights",
]

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """This process's place among the training processes."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def current_world() -> World:
    """The processes ``accelerate launch``/``torchrun`` started (a plain run is a world of one);
    accelerate joins the process group on first use."""
    from accelerate import PartialState

    state = PartialState(cpu=_cpu_only())
    return World(rank=state.process_index, world_size=state.num_processes)


def build_accelerator(settings: TrainingSettings, log_with: list[GeneralTracker] | None = None) -> Accelerator:
    """An ``Accelerator`` for ``training.mixed_precision``; DDP, FSDP or DeepSpeed come from the
    launcher's configuration (``accelerate launch --use_fsdp ...``), never from the manifest, so
    one manifest runs unchanged on every engine. ``log_with``: the run's trackers (``tracking.py``)."""
    from accelerate import Accelerator, PartialState
    from accelerate.state import AcceleratorState, GradientState

    if not PartialState(cpu=_cpu_only()).use_distributed:
        # One process may train several times (notebooks, tests) with different precisions;
        # accelerate keeps one global state, so start each run from a fresh one.
        AcceleratorState._reset_state()
        GradientState._reset_state()
    try:
        accelerator = Accelerator(
            cpu=_cpu_only(), mixed_precision=settings.mixed_precision, step_scheduler_with_optimizer=False,
            log_with=log_with or None,
        )
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            [f"training.mixed_precision {settings.mixed_precision!r}: {exc} Use 'no', or 'bf16' "
             "(CPUs and recent GPUs), or 'fp16' (GPUs)."],
            "training settings",
        ) from None
    _fsdp_on_cpu(accelerator)
    return accelerator


def _fsdp_on_cpu(accelerator: Accelerator) -> None:
    """``accelerate launch --use_fsdp`` on CPUs: accelerate 1.15 starts plain multi-CPU (DDP)
    processes and ignores the FSDP plugin, though torch's FSDP2 shards over gloo. Switch the
    shared state to FSDP with the plugin the launcher described (its environment variables)."""
    import os

    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    wanted = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if not wanted or accelerator.distributed_type != DistributedType.MULTI_CPU:
        return
    plugin = FullyShardedDataParallelPlugin()
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    from accelerate import PartialState

    accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # both shared states agree


def _cpu_only() -> bool:
    """No accelerator device: accelerate then runs several launched processes on CPU (gloo)
    only when told so; with one, it picks the device itself."""
    import torch

    if hasattr(torch, "accelerator"):  # torch >= 2.6: any device type, named by none
        return not torch.accelerator.is_available()
    from accelerate.utils import is_cuda_available, is_xpu_available

    return not (is_cuda_available() or is_xpu_available())


def describe_engine(accelerator: Accelerator) -> str:
    """One line naming the engine, e.g. ``accelerate FSDP2, 2 processes, bf16, cpu``."""
    from accelerate.utils import DistributedType

    kind = accelerator.distributed_type
    if kind == DistributedType.FSDP:
        name = "FSDP2" if accelerator.is_fsdp2 else "FSDP"
    elif kind == DistributedType.DEEPSPEED:
        name = "DeepSpeed"
    elif kind == DistributedType.NO:
        name = "single process"
    else:
        name = "DDP"
    count = accelerator.num_processes
    processes = f"{count} process{'es' if count != 1 else ''}"
    precision = accelerator.mixed_precision if accelerator.mixed_precision != "no" else "fp32"
    return f"accelerate {name}, {processes}, {precision}, {accelerator.device.type}"


def merge_over_ranks(accelerator: Accelerator, metrics: Mapping[str, float]) -> dict[str, float]:
    """Each metric combined over the ranks that report it, as a step's batches are
    (``metrics.reduction_of``: counts summed, maxima the largest, the rest averaged); the keys may
    differ between ranks (a reward component, ``reward/<name>``, only some rank's episodes gave),
    so they are agreed on first."""
    if accelerator.num_processes == 1:
        return dict(metrics)
    import math

    import torch
    from accelerate.utils import gather_object

    from agilerl.train.metrics import reduction_of

    keys = sorted({key for keys in gather_object([sorted(metrics)]) for key in keys})
    local = [
        [float(metrics.get(k, 0.0)) for k in keys],
        [float(k in metrics) for k in keys],
        [float(metrics.get(k, -math.inf)) for k in keys],
    ]
    # one gather of (values, counts, largest) per rank: sums and maxima are taken here
    every = accelerator.gather(torch.tensor([local], dtype=torch.float64, device=accelerator.device))
    values, counts = every[:, 0].sum(dim=0), every[:, 1].sum(dim=0)
    largest = every[:, 2].max(dim=0).values
    means = (values / counts.clamp(min=1)).cpu().tolist()
    sums, maxima = values.cpu().tolist(), largest.cpu().tolist()
    by = {"mean": means, "sum": sums, "max": maxima}
    return {key: by[reduction_of(key)][i] for i, key in enumerate(keys)}


def run_agreed(accelerator: Accelerator, fn: Callable[[], T]) -> T:
    """``fn()`` on every rank, then one small all-gather of whether it raised. When any rank's
    did, every rank raises (its own error, or ``RankFailed`` naming the ranks that failed), marked
    so the trainer knows all ranks stopped at the same point and can save together.

    Without it a rank whose collection failed (its envs down) left the others waiting in the
    next collective until the launcher killed them, and nothing was saved. Every rank must call
    it at the same points; one process runs ``fn`` as it is."""
    if accelerator.num_processes == 1:
        return fn()
    import torch

    failure: Exception | None = None
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - handed on below, to every rank
        failure = exc
    flags = accelerator.gather(torch.tensor([float(failure is not None)], device=accelerator.device))
    failed = [rank for rank, flag in enumerate(flags.cpu().tolist()) if flag]
    if not failed:
        return result
    error = failure or RankFailed(
        f"rank{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} of {accelerator.num_processes} "
        f"failed (its error is above, from that rank); rank {accelerator.process_index} stopped with it"
    )
    error.__agilerl_failed_together__ = True  # type: ignore[attr-defined]
    raise error


def failed_together(exc: BaseException) -> bool:
    """Whether ``exc`` came out of ``run_agreed`` on every rank at once (a save can be collective)."""
    return bool(getattr(exc, "__agilerl_failed_together__", False))


def prepare_reference(accelerator: Accelerator, reference: torch.nn.Module) -> torch.nn.Module:
    """The frozen reference placed like the policy: under FSDP2 sharded as the policy is (as
    TRL does), so a model that only fits sharded fits as its own reference; elsewhere a whole
    copy per rank, which DDP has nothing to synchronise for. The LoRA reference (the policy with
    its adapters off) owns no weights and is only placed."""
    if accelerator.is_fsdp2 and any(True for _ in reference.parameters()):
        from accelerate.utils.fsdp_utils import fsdp2_prepare_model

        return fsdp2_prepare_model(accelerator, reference).eval()
    return accelerator.prepare_model(reference, evaluation_mode=True)


@contextmanager
def gathered_weights(*modules: torch.nn.Module | None) -> Iterator[None]:
    """Under FSDP2, every sharded weight of ``modules`` gathered once and kept whole while the
    block runs (every rank must enter it); outside FSDP2 nothing happens.

    Generation calls the model a different number of times on each rank (episodes and
    completions end when they end), and evaluation runs on rank 0 alone; sharded weights would
    be gathered by collectives inside every call and the ranks would wait on each other forever.
    Whole weights need none. As TRL's ``unwrap_model_for_generation``; costs one full copy of
    the weights while it lasts.
    """
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without FSDP2: nothing can be sharded
        yield
        return
    present = [module for module in modules if module is not None]
    sharded = [m for module in present for m in module.modules() if isinstance(m, FSDPModule)]
    if not sharded:
        yield
        return
    for m in sharded:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    # transformers turns on ``synced_gpus`` for FSDP modules: one all-reduce per generated token,
    # so a rank generating alone (rank 0's evaluation) would wait forever. Whole weights need none.
    generators = [m for module in present for m in module.modules() if callable(getattr(type(m), "generate", None))]
    for m in generators:
        m.generate = functools.partial(type(m).generate, m, synced_gpus=False)
    try:
        yield
    finally:
        for m in generators:
            del m.generate
        for m in sharded:
            m.reshard()
            m.set_reshard_after_forward(True, recurse=False)
