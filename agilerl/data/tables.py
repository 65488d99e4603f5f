"""Load a table once (HuggingFace id, Parquet, JSONL, CSV, ``save_to_disk`` folder); split it.

Tables stay Arrow-backed ``datasets.Dataset`` objects (memory-mapped where ``datasets`` caches
them), so every env built on one shares the same rows instead of holding Python copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agilerl.errors import DatasetLoadError

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = ["DATASET_ENV_CONFIG_KEYS", "Splits", "load_table", "rename_columns", "split_table"]

_FILE_LOADERS = {
    ".parquet": "parquet",
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
}


# env_config keys a dataset-backed env (rollout or dataset) accepts.
DATASET_ENV_CONFIG_KEYS = ("system_prompt", "split_seed", "subset", "split")


@dataclass(frozen=True)
class Splits:
    """The train rows and the held-out rows of one table; built once, shared read-only."""

    train: Dataset
    test: Dataset

    def split(self, evaluation: bool | None) -> Dataset:
        """The held-out rows when ``evaluation`` is true, else the train rows."""
        return self.test if evaluation else self.train


def load_table(
    source: str,
    *,
    base_dir: str | Path | None = None,
    columns: dict[str, str] | None = None,
    subset: str | None = None,
    split: str = "train",
) -> Dataset:
    """Load ``source`` as one ``datasets.Dataset`` and apply the ``{src: dst}`` column renames.

    A path (relative to ``base_dir``) is read by its suffix, or as a ``save_to_disk`` folder, or
    as a folder of data files; anything else is a HuggingFace Hub id (``subset``/``split`` apply).
    """
    table = _load(source, Path(base_dir or Path.cwd()), subset, split)
    return rename_columns(table, columns or {}, source)


def _load(source: str, base_dir: Path, subset: str | None, split: str) -> Dataset:
    import datasets

    path = Path(source).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    suffix = path.suffix.lower()
    looks_like_path = suffix in _FILE_LOADERS or source.startswith((".", "/", "~"))
    try:
        if path.is_file():
            if suffix not in _FILE_LOADERS:
                raise DatasetLoadError(
                    f"dataset {source!r}: unsupported file type {suffix or '(none)'!r}; use "
                    f"one of {', '.join(sorted(_FILE_LOADERS))} or a save_to_disk folder."
                )
            return datasets.load_dataset(
                _FILE_LOADERS[suffix], data_files=str(path), split="train"
            )
        if path.is_dir():
            if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file():
                return _pick_split(datasets.load_from_disk(str(path)), source, split)
            return datasets.load_dataset(str(path), subset, split=split)
        if looks_like_path:
            raise DatasetLoadError(
                f"dataset {source!r}: no such file or folder: {path} (relative paths resolve "
                "from the manifest's folder)."
            )
        return datasets.load_dataset(source, subset, split=split)
    except DatasetLoadError:
        raise
    except Exception as exc:  # datasets raises many unrelated types; name the source once.
        raise DatasetLoadError(
            f"dataset {source!r} could not be loaded ({type(exc).__name__}: {exc}). Check the "
            "path or HuggingFace id, and that the file is valid."
        ) from exc


def _pick_split(loaded: Any, source: str, split: str) -> Dataset:
    """``load_from_disk`` gives a Dataset, or a DatasetDict from which ``split`` is taken."""
    if not hasattr(loaded, "keys"):
        return loaded
    if split not in loaded:
        raise DatasetLoadError(
            f"dataset {source!r} has no split {split!r}; it has: {', '.join(loaded)}. "
            "Set env_config.split to one of them."
        )
    return loaded[split]


def rename_columns(table: Dataset, columns: dict[str, str], source: str) -> Dataset:
    """Rename ``{src: dst}``; a missing ``src`` or clashing ``dst`` names the existing columns."""
    if not columns:
        return table
    existing = list(table.column_names)
    missing = [src for src in columns if src not in existing]
    if missing:
        raise DatasetLoadError(
            f"columns: {', '.join(map(repr, missing))} not in dataset {source!r}; its columns "
            f"are: {', '.join(existing)}."
        )
    kept = set(existing) - set(columns)
    clashes = sorted({dst for dst in columns.values() if dst in kept})
    targets = list(columns.values())
    clashes += sorted({dst for dst in targets if targets.count(dst) > 1} - set(clashes))
    if clashes:
        raise DatasetLoadError(
            f"columns: renaming would create duplicate column(s) {', '.join(map(repr, clashes))} "
            f"in dataset {source!r} (columns: {', '.join(existing)}); rename or drop the "
            "existing column first."
        )
    return table.rename_columns(columns)


def split_table(table: Dataset, train_fraction: float, seed: int = 0) -> Splits:
    """Split deterministically: the same table, fraction and seed always give the same rows.

    Both halves are index views over the one table (no rows are copied). A table of two or
    more rows keeps at least one row on each side.
    """
    import numpy as np

    size = len(table)
    if size == 0:
        raise DatasetLoadError("the dataset has no rows.")
    n_train = round(size * train_fraction)
    if size >= 2:
        n_train = min(max(n_train, 1), size - 1)
    order = np.random.default_rng(seed).permutation(size)
    train_rows = np.sort(order[:n_train])
    test_rows = np.sort(order[n_train:])
    return Splits(train=table.select(train_rows), test=table.select(test_rows))
