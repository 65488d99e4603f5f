"""Reproducible updates: torch's deterministic algorithms for the length of a run.

A seeded run on a CPU repeats its metrics only if every op gives the same bits every time. Most
do for a given thread count, but not all: the backward of an advanced index (``x[index]``, as in
the shared-prefix cache the loss's forward indexes out to each row of a GRPO group) adds into
the same gradient elements from several threads with atomic adds, so the sum's order, and its
last bits, follow the threads' timing. ``torch.use_deterministic_algorithms`` routes such ops to
their deterministic kernels (on a CPU a serial sum, at next to no cost), so it is on by default
on CPUs (``training.deterministic``: null) and on request on GPUs (true), where cuBLAS also needs
``CUBLAS_WORKSPACE_CONFIG``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["CUBLAS_WORKSPACE", "deterministic_algorithms"]

CUBLAS_WORKSPACE = ":4096:8"
"""cuBLAS's deterministic workspace setting (CUDA's docs; ``:16:8`` also works, more slowly)."""


@contextmanager
def deterministic_algorithms(setting: bool | None, device: Any) -> Iterator[bool]:
    """While the run lasts, torch's deterministic algorithms on where ``setting`` asks (None: on
    a CPU only, warning instead of failing on an op with no deterministic kernel; True: on any
    device, strictly); whether they are on. torch's switches are put back as they were."""
    import torch
    import torch.utils.deterministic

    on = setting if setting is not None else getattr(device, "type", str(device)) == "cpu"
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
        torch.backends.cudnn.benchmark,
    )
    if on:
        if setting:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)  # read when cuBLAS starts
        torch.use_deterministic_algorithms(True, warn_only=setting is None)
        if setting is None:  # NaN-filling every new tensor guards no correct op's result: skip its cost
            torch.utils.deterministic.fill_uninitialized_memory = False
        torch.backends.cudnn.benchmark = False
    try:
        yield on
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.utils.deterministic.fill_uninitialized_memory = before[2]
        torch.backends.cudnn.benchmark = before[3]
