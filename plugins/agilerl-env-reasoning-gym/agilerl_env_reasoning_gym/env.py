"""reasoning-gym datasets as ``QADatasetEnv``s, scored by ``dataset.score_answer(answer, entry)``.

Rows are generated once per ``(dataset, size, seed, config)`` and shared by every env built
with those arguments. Each row keeps the key of its generator, so the rubric scores against the
exact entry reasoning-gym produced (not a JSON copy of it).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

from agilerl.data.qa_dataset import QADataset, QADatasetEnv
from agilerl.data.rubric import Rubric
from agilerl.errors import AgileRLError

_lock = threading.RLock()
_generators: dict[str, Any] = {}
_tables: dict[tuple[str, float, int, str | None], QADataset] = {}


class ReasoningGymError(AgileRLError):
    """A reasoning-gym dataset name or config was rejected."""


def make_env(
    dataset: str,
    *,
    size: int = 500,
    seed: int = 0,
    config: Mapping[str, Any] | None = None,
    train_test_split: float = 0.9,
    split_seed: int = 0,
    prompt_template: Mapping[str, str] | None = None,
    system_prompt: str | None = None,
) -> QADatasetEnv:
    """An env over ``size`` rows of reasoning-gym's ``dataset`` (generated from ``seed``).

    The default prompt is the question, with reasoning-gym's default system prompt (which asks
    for the answer in ``<answer>`` tags); ``system_prompt`` or ``prompt_template`` replace them.
    """
    from reasoning_gym.utils import SYSTEM_PROMPTS

    key = _generator_key(dataset, size, seed, config)
    template_key = json.dumps(prompt_template, sort_keys=True) if prompt_template else None
    with _lock:
        data = _tables.get((key, train_test_split, split_seed, template_key))
        if data is None:
            data = QADataset.build(
                _rows(key),
                Rubric.bind(score, name="reasoning-gym"),
                prompt_template=prompt_template,
                train_test_split=train_test_split,
                split_seed=split_seed,
                max_reward=1.0,
            )
            _tables[(key, train_test_split, split_seed, template_key)] = data
    if system_prompt is None and prompt_template is None:
        system_prompt = SYSTEM_PROMPTS["default"]
    return QADatasetEnv(data, system_prompt=system_prompt)


def score(completion: str, row: Mapping[str, Any]) -> float:
    """reasoning-gym's score for the final ``<answer>`` block of ``completion``.

    Rows from :func:`make_env` are scored against their exact generated entry; rows from a file
    of reasoning-gym entries (``question``, ``answer``, ``metadata`` with ``source_dataset``)
    are scored by that dataset's default scorer.
    """
    from reasoning_gym.utils import extract_answer

    answer = extract_answer(completion)
    if row.get("rg_generator"):
        generator = _generator(row["rg_generator"])
        return float(generator.score_answer(answer, generator[int(row["source_index"])]))
    return float(_file_row_scorer(row)(answer, _file_row_entry(row)))


def _generator_key(dataset: str, size: int, seed: int, config: Mapping[str, Any] | None) -> str:
    return json.dumps(
        {"dataset": dataset, "size": size, "seed": seed, "config": dict(config or {})},
        sort_keys=True,
    )


def _generator(key: str) -> Any:
    """The reasoning-gym dataset a key describes, created once per process."""
    import reasoning_gym

    with _lock:
        if key not in _generators:
            spec = json.loads(key)
            try:
                _generators[key] = reasoning_gym.create_dataset(
                    spec["dataset"], size=spec["size"], seed=spec["seed"], **spec["config"]
                )
            except Exception as exc:
                raise ReasoningGymError(
                    f"reasoning-gym could not create dataset {spec['dataset']!r} with size="
                    f"{spec['size']}, seed={spec['seed']}, config={spec['config']}: {exc}. "
                    "Check the name (reasoning_gym.factory.DATASETS lists them) and config keys."
                ) from exc
        return _generators[key]


def _rows(key: str) -> Any:
    """The generated entries as an Arrow-backed table: question, answer, source_index, generator."""
    import datasets

    generator = _generator(key)
    entries = [generator[i] for i in range(len(generator))]
    return datasets.Dataset.from_dict(
        {
            "question": [e["question"] for e in entries],
            "answer": [str(e["answer"]) for e in entries],
            "source_index": list(range(len(entries))),
            "rg_generator": [key] * len(entries),
        }
    )


def _file_row_entry(row: Mapping[str, Any]) -> dict[str, Any]:
    metadata = row.get("metadata") or {}
    if isinstance(metadata, str):
        metadata = json.loads(metadata)
    return {"question": row.get("question"), "answer": row.get("answer"), "metadata": metadata}


def _file_row_scorer(row: Mapping[str, Any]) -> Any:
    import reasoning_gym

    name = _file_row_entry(row)["metadata"].get("source_dataset")
    if not name:
        raise ReasoningGymError(
            "this row has neither a reasoning-gym generator key nor metadata.source_dataset; "
            "score rows made by the reasoning-gym env or exported from reasoning-gym."
        )
    return reasoning_gym.get_score_answer_fn(name)
