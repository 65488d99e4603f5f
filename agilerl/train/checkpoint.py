"""Checkpoints a run resumes from: a ``save_pretrained`` folder plus the optimiser and step.

``<output_dir>/checkpoints/step-000042/`` holds the model (or its LoRA adapters) and tokenizer
exactly as ``from_pretrained`` reads them, ``optimizer.pt``, ``trainer_state.json`` and, when the
algorithm adds trainable heads (PPO's value head), ``extra_params.pt``. A folder appears only
once complete: it is written under a temporary name and renamed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agilerl.errors import CheckpointError

if TYPE_CHECKING:
    import torch

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
EXTRA_PARAMS_FILE = "extra_params.pt"


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / CHECKPOINTS / f"step-{step:06d}"


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    *,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    policy: torch.nn.Module | None = None,
    state: dict[str, Any] | None = None,
) -> Path:
    """Write the checkpoint of ``step``; ``policy`` is the trained module when it wraps ``model``."""
    import torch
    from transformers.utils import logging

    final = checkpoint_dir(output_dir, step)
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    quiet = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # no "Writing model shards" bar inside ours
    try:
        model.save_pretrained(partial)
    finally:
        if quiet:
            logging.enable_progress_bar()
    tokenizer.save_pretrained(partial)
    torch.save(optimizer.state_dict(), partial / OPTIMIZER_FILE)
    extra = _extra_params(model, policy)
    if extra:
        torch.save(extra, partial / EXTRA_PARAMS_FILE)
    (partial / STATE_FILE).write_text(json.dumps({"step": step, **(state or {})}, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    return final


def find_checkpoint(ref: str | Path, output_dir: str | Path) -> Path:
    """``ref`` is a checkpoint folder, or ``latest``: the newest complete one under ``output_dir``."""
    if str(ref) == "latest":
        found = sorted((Path(output_dir) / CHECKPOINTS).glob("step-*[0-9]"))
        if not found:
            raise CheckpointError(
                f"resume 'latest': no checkpoint under {Path(output_dir) / CHECKPOINTS}; train "
                "once without --resume first, or name a checkpoint folder."
            )
        return found[-1]
    path = Path(ref)
    if not (path / STATE_FILE).is_file():
        raise CheckpointError(
            f"resume_from {str(ref)!r} is not a checkpoint folder (it has no {STATE_FILE}); "
            f"name a folder under <output_dir>/{CHECKPOINTS}/ or use 'latest'."
        )
    return path


def read_state(path: str | Path) -> dict[str, Any]:
    """The ``trainer_state.json`` of a checkpoint (``step`` and what the loop stored)."""
    return json.loads((Path(path) / STATE_FILE).read_text())


def restore_training_state(
    path: str | Path, optimizer: torch.optim.Optimizer, model: Any, policy: torch.nn.Module
) -> int:
    """Load the optimiser (and extra heads) saved at ``path``; return the step to continue from.

    The model's own weights are loaded by ``load_model_and_tokenizer(..., checkpoint=path)``.
    """
    import torch

    path = Path(path)
    optimizer.load_state_dict(torch.load(path / OPTIMIZER_FILE, weights_only=True))
    extra_file = path / EXTRA_PARAMS_FILE
    if extra_file.is_file():
        policy.load_state_dict(torch.load(extra_file, weights_only=True), strict=False)
    return int(read_state(path)["step"])


def _extra_params(model: Any, policy: torch.nn.Module | None) -> dict[str, Any]:
    """The policy's tensors that ``model.save_pretrained`` does not cover (added heads)."""
    if policy is None or policy is model:
        return {}
    own = model.state_dict(keep_vars=True)  # the Parameter objects themselves, alive while compared
    shared = {id(t) for t in own.values()}
    return {k: v.detach() for k, v in policy.state_dict(keep_vars=True).items() if id(v) not in shared}
