"""Checkpoints a run resumes from: a ``save_pretrained`` folder plus accelerate's saved state.

``<output_dir>/checkpoints/step-000042/`` holds the model (or its LoRA adapters) and tokenizer
exactly as ``from_pretrained`` reads them (whole, even when training sharded them with FSDP),
``trainer_state.json``, when the algorithm adds trainable heads (PPO's value head)
``extra_params.pt``, and ``accelerate/``: ``Accelerator.save_state``'s model, optimiser and RNG
states (sharded under FSDP), which ``--resume`` loads. A folder appears only once complete: it is
written under a temporary name and renamed. After each save only the newest ``keep_last`` are kept.

``trainer_state.json`` also records the size of every file written, the algorithm and whether the
weights are LoRA adapters, so a resume finds a damaged checkpoint (a truncated file: a full disk,
a copy cut short) or one of another kind of run before anything loads: ``latest`` falls back to the
newest whole checkpoint with a warning; a damaged folder named on its own is an error naming it.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agilerl.errors import CheckpointError
from agilerl.generation.media import processor_of

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator

__all__ = [
    "CHECKPOINTS",
    "STATE_FILE",
    "ACCELERATE_STATE",
    "EXTRA_PARAMS_FILE",
    "checkpoint_dir",
    "saved_checkpoints",
    "rotate_checkpoints",
    "save_checkpoint",
    "find_checkpoint",
    "checkpoint_damage",
    "check_resumable",
    "read_state",
    "restore_training_state",
]

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.json"
ACCELERATE_STATE = "accelerate"
EXTRA_PARAMS_FILE = "extra_params.pt"


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / CHECKPOINTS / f"step-{step:06d}"


def saved_checkpoints(output_dir: str | Path) -> list[Path]:
    """The complete checkpoints under ``output_dir``, oldest step first."""
    found = []
    for path in (Path(output_dir) / CHECKPOINTS).glob("step-*"):
        number = path.name.removeprefix("step-")
        if number.isdigit() and path.is_dir():
            found.append((int(number), path))
    return [path for _, path in sorted(found)]


def rotate_checkpoints(output_dir: str | Path, keep_last: int | None) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints (None keeps all), and any half-written
    one a killed save left; return what was deleted. The newest is never deleted."""
    saved = saved_checkpoints(output_dir)
    old = saved[: -max(keep_last, 1)] if keep_last is not None else []
    old += sorted((Path(output_dir) / CHECKPOINTS).glob("step-*.partial"))
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return old


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    *,
    accelerator: Accelerator,
    model: Any,
    tokenizer: Any,
    policy: torch.nn.Module,
    state: dict[str, Any] | None = None,
    keep_last: int | None = None,
) -> Path:
    """Write the checkpoint of ``step``; every process calls it (a sharded state is saved by all).

    ``policy`` is the prepared module the optimiser trains (``model`` itself or a wrapper of it);
    ``keep_last`` rotates the older checkpoints away once this one is complete.
    """
    import torch
    from transformers.utils import logging

    final = checkpoint_dir(output_dir, step)
    partial = final.with_name(final.name + ".partial")
    main = accelerator.is_main_process
    # The folder's life has three phases, each closed by a barrier: rank 0 makes it; every rank
    # writes its share into it (accelerate's per-rank shards and RNG states, with no barrier of
    # its own after them); rank 0 alone adds the whole model and renames it. Without the middle
    # barrier rank 0 renamed the folder while a slower rank still wrote into it ("Parent
    # directory ... does not exist" on a busy host).
    if main:
        shutil.rmtree(partial, ignore_errors=True)
        (partial / ACCELERATE_STATE).mkdir(parents=True)
    accelerator.wait_for_everyone()
    full = accelerator.get_state_dict(policy)  # whole weights (gathered when sharded) on rank 0
    with _quiet_about_tied_weights(accelerator.unwrap_model(policy)):
        accelerator.save_state(str(partial / ACCELERATE_STATE))
    accelerator.wait_for_everyone()  # every rank's files are written before rank 0 moves the folder
    if main:
        own, extra = _split_state(accelerator.unwrap_model(policy), model, full)
        quiet = logging.is_progress_bar_enabled()
        logging.disable_progress_bar()  # no "Writing model shards" bar inside ours
        try:
            # sharded: the gathered weights; otherwise the model's own tensors, as transformers saves them
            model.save_pretrained(partial, **({"state_dict": own} if _sharded(accelerator) else {}))
        finally:
            if quiet:
                logging.enable_progress_bar()
        (processor_of(tokenizer) or tokenizer).save_pretrained(partial)  # a VLM's: its image processor too
        if extra:
            torch.save(extra, partial / EXTRA_PARAMS_FILE)
        # last: what a resume checks the folder against (every rank's files are in by now)
        written = {"step": step, **(state or {}), "lora": _is_lora(model), "files": _file_sizes(partial)}
        (partial / STATE_FILE).write_text(json.dumps(written, indent=2))
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        rotate_checkpoints(output_dir, keep_last)
    accelerator.wait_for_everyone()
    return final


def find_checkpoint(ref: str | Path, output_dir: str | Path) -> Path:
    """``ref`` is a checkpoint folder, or ``latest``: the newest whole one under ``output_dir``
    (a damaged newer one is passed over with a warning). A damaged folder named on its own, or
    no whole one left, is a ``CheckpointError`` naming what is wrong and what to do."""
    if str(ref) == "latest":
        found = saved_checkpoints(output_dir)
        if not found:
            raise CheckpointError(
                f"resume 'latest': no checkpoint under {Path(output_dir) / CHECKPOINTS}; train "
                "once without --resume first, or name a checkpoint folder."
            )
        damaged = []
        for path in reversed(found):
            problem = checkpoint_damage(path)
            if problem is None:
                for bad, why in damaged:
                    _warn(f"checkpoint {bad} is damaged ({why}); resuming from the newest whole one, {path}")
                return path
            damaged.append((path, problem))
        listed = "; ".join(f"{bad}: {why}" for bad, why in damaged)
        raise CheckpointError(
            f"resume 'latest': every checkpoint under {Path(output_dir) / CHECKPOINTS} is damaged "
            f"({listed}); start a new run (a new --output-dir, or --overwrite)."
        )
    path = Path(ref)
    if not (path / STATE_FILE).is_file():
        raise CheckpointError(
            f"resume_from {str(ref)!r} is not a checkpoint folder (it has no {STATE_FILE}); "
            f"name a folder under <output_dir>/{CHECKPOINTS}/ or use 'latest'."
        )
    problem = checkpoint_damage(path)
    if problem is not None:
        others = [p for p in saved_checkpoints(path.parent.parent) if p != path and checkpoint_damage(p) is None]
        fix = f"resume from an earlier one (--resume {others[-1]})" if others else "start a new run"
        raise CheckpointError(f"checkpoint {path} is damaged ({problem}); {fix}.")
    return path


def checkpoint_damage(path: str | Path) -> str | None:
    """What is wrong with the checkpoint folder ``path`` (a missing or truncated file, an
    unreadable ``trainer_state.json``), or None when it is whole. Sizes are checked against those
    recorded at save; a checkpoint from before that record has its safetensors headers checked."""
    path = Path(path)
    try:
        state = read_state(path)
        int(state["step"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its {STATE_FILE} is unreadable: {type(exc).__name__}: {exc}"
    recorded = state.get("files")
    if isinstance(recorded, dict):
        for name, size in recorded.items():
            file = path / name
            if not file.is_file():
                return f"{name} is missing"
            if file.stat().st_size != size:
                return f"{name} is {file.stat().st_size:,} bytes, {size:,} were written"
        return None
    for file in sorted(path.rglob("*.safetensors")):
        problem = _safetensors_damage(file)
        if problem:
            return f"{file.relative_to(path)} {problem}"
    return None


def check_resumable(path: str | Path, *, algorithm: str, lora: bool) -> None:
    """``CheckpointError`` when the checkpoint at ``path`` was written by a run of another kind:
    another algorithm (its optimiser and heads differ) or LoRA against full weights. Says what
    changed and both ways out, before any weights load."""
    path = Path(path)
    state = read_state(path)
    saved_lora = state.get("lora")
    if not isinstance(saved_lora, bool):  # a checkpoint from before the record: its files say
        saved_lora = (path / "adapter_config.json").is_file()
    changes = []
    saved_algorithm = state.get("algorithm")
    if isinstance(saved_algorithm, str) and saved_algorithm != algorithm:
        changes.append(f"the algorithm is {algorithm}, the checkpoint's is {saved_algorithm}")
    if saved_lora != lora:
        kinds = {True: "LoRA adapters", False: "full weights"}
        changes.append(f"the model trains {kinds[lora]}, the checkpoint holds {kinds[saved_lora]}")
    if changes:
        raise CheckpointError(
            f"cannot resume from {path}: {'; '.join(changes)}. A resumed run must be the same "
            "kind of run: switch the manifest back, or start fresh from those weights in a new "
            f"output_dir (model.name_or_path: {path})."
        )


def read_state(path: str | Path) -> dict[str, Any]:
    """The ``trainer_state.json`` of a checkpoint (``step`` and what the loop stored)."""
    return json.loads((Path(path) / STATE_FILE).read_text())


def restore_training_state(path: str | Path, accelerator: Accelerator) -> int:
    """Load the model, optimiser and RNG states saved at ``path`` into the prepared objects
    (each rank its shard under FSDP); return the step to continue from."""
    path = Path(path)
    saved = path / ACCELERATE_STATE
    if not saved.is_dir():
        raise CheckpointError(
            f"checkpoint {path} has no {ACCELERATE_STATE}/ folder (written by an older agilerl, "
            "or copied without it); its weights load with from_pretrained, but the run cannot "
            "resume from it: start a new run from those weights instead (model.name_or_path)."
        )
    try:
        accelerator.load_state(str(saved))
    except (RuntimeError, KeyError, ValueError) as exc:  # a state_dict of another shape
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"cannot resume from {path}: its saved state does not fit this run's model or optimiser "
            f"({first}); was the model, the algorithm or model.lora changed? Switch the manifest "
            "back, or start fresh from those weights in a new output_dir."
        ) from exc
    return int(read_state(path)["step"])


def _file_sizes(folder: Path) -> dict[str, int]:
    return {
        p.relative_to(folder).as_posix(): p.stat().st_size
        for p in sorted(folder.rglob("*")) if p.is_file() and p.name != STATE_FILE
    }


def _is_lora(model: Any) -> bool:
    return hasattr(model, "peft_config")


def _safetensors_damage(file: Path) -> str | None:
    """Whether a safetensors file is cut short: its header (8-byte length, JSON) names where
    every tensor's bytes end; the file must reach the last of them."""
    try:
        size = file.stat().st_size
        with file.open("rb") as f:
            head = f.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else -1
            if length < 2 or 8 + length > size:
                return f"is truncated ({size:,} bytes, no whole header)"
            header = json.loads(f.read(length))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        return f"is unreadable ({type(exc).__name__}: {exc})"
    if 8 + length + max(ends, default=0) > size:
        return f"is truncated ({size:,} bytes, its header needs {8 + length + max(ends):,})"
    return None


def _warn(message: str) -> None:
    """One warning line on stderr, from the launcher's rank 0 only (every rank finds the same)."""
    import os
    import sys

    if os.environ.get("RANK", "0") == "0":
        print(f"warning: {message}", file=sys.stderr, flush=True)


@contextmanager
def _quiet_about_tied_weights(module: torch.nn.Module) -> Iterator[None]:
    """accelerate warns "Removed shared tensor {'lm_head.weight'} while saving" at every save of a
    model whose output layer shares the embeddings' weight; loading ties them again, so for tied
    parameters the warning says nothing. Any other shared tensor still warns."""
    import logging

    by_param: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        by_param.setdefault(id(param), []).append(name)
    tied = {name for names in by_param.values() if len(names) > 1 for name in names}

    def keep(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "Removed shared tensor" not in message:
            return True
        removed = set(re.findall(r"'([^']+)'", message.partition(" while saving")[0]))
        return not removed or not removed <= tied

    logger = logging.getLogger("accelerate.utils.other")  # where accelerate's save_model warns
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def _sharded(accelerator: Accelerator) -> bool:
    from accelerate.utils import DistributedType

    return accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)


def _split_state(policy: torch.nn.Module, model: Any, full: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``full`` (the policy's state) as ``model``'s own state dict and the rest (added heads)."""
    if policy is model:
        return full, {}
    prefix = next(name + "." for name, module in policy.named_modules() if module is model)
    own = {k[len(prefix):]: v for k, v in full.items() if k.startswith(prefix)}
    extra = {k: v for k, v in full.items() if not k.startswith(prefix)}
    return own, extra
