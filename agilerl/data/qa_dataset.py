"""QADatasetEnv: the model answers one labelled row, a rubric scores it (a single-turn rollout).

The table, its split, the template and the rubric live in one read-only ``QADataset`` that every
env of a rollout shares; an env itself holds only the row it is serving.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agilerl.errors import DatasetLoadError, EpisodeError, InvalidArgument
from agilerl.data.rubric import Rubric
from agilerl.data.tables import Splits, split_table
from agilerl.data.templates import PromptTemplate, user_text, with_system_prompt

if TYPE_CHECKING:
    from datasets import Dataset

    from agilerl.manifest.spec import EnvironmentSpec

__all__ = ["QADataset", "QADatasetEnv"]


@dataclass(frozen=True)
class QADataset:
    """Everything a QADatasetEnv reads and never writes: built once, shared by every env."""

    splits: Splits
    template: PromptTemplate
    rubric: Rubric
    max_reward: float | None = None

    @classmethod
    def build(
        cls,
        table: Dataset,
        rubric: Rubric | Callable[..., Any],
        *,
        prompt_template: Mapping[str, str] | None = None,
        train_test_split: float = 0.9,
        split_seed: int = 0,
        max_reward: float | None = None,
    ) -> QADataset:
        """Check the template and rubric against the columns, then split the table."""
        template = (
            PromptTemplate.parse(prompt_template)
            if prompt_template is not None
            else PromptTemplate.single_user("question")
        )
        template.check_columns(table.column_names)
        bound = rubric if isinstance(rubric, Rubric) else Rubric.bind(rubric)
        bound.check_columns(table.column_names)
        if max_reward is not None and max_reward <= 0:
            raise InvalidArgument(f"max_reward must be positive, got {max_reward}.")
        return cls(split_table(table, train_test_split, split_seed), template, bound, max_reward)


class QADatasetEnv:
    """One labelled row per episode: ``reset`` serves its prompt, ``step`` scores the answer.

    ``info["messages"]`` holds the rendered chat (system/user/assistant pieces of the template);
    the harness renders it with the chat template. The returned prompt is the last user message.
    Pass a ``datasets.Dataset`` and a rubric, or a prepared ``QADataset`` to share one table.
    """

    max_turns = 1

    def __init__(
        self,
        dataset: Dataset | QADataset,
        rubric: Rubric | Callable[..., Any] | None = None,
        *,
        prompt_template: Mapping[str, str] | None = None,
        train_test_split: float = 0.9,
        split_seed: int = 0,
        max_reward: float | None = None,
        system_prompt: str | None = None,
    ) -> None:
        if not isinstance(dataset, QADataset):
            if rubric is None:
                raise InvalidArgument("QADatasetEnv needs a rubric to score answers.")
            dataset = QADataset.build(
                dataset,
                rubric,
                prompt_template=prompt_template,
                train_test_split=train_test_split,
                split_seed=split_seed,
                max_reward=max_reward,
            )
        self.data = dataset
        self.system_prompt = system_prompt
        self._rng: random.Random | None = None  # made on the first unseeded reset only
        self._row: dict[str, Any] | None = None
        self._info: dict[str, Any] = {}

    @classmethod
    def from_spec(
        cls, spec: EnvironmentSpec, *, base_dir: str | Path | None = None
    ) -> QADatasetEnv:
        """One env from a manifest's ``environment:`` section (the mapping lives in assembly)."""
        from agilerl.assembly.datasets import qa_env_factory  # the door: see [tool.importlinter]

        return qa_env_factory(spec, base_dir=base_dir)()

    @property
    def dataset_size(self) -> int:
        """Rows in the train split (``reset(row_index=...)`` takes 0 .. dataset_size-1)."""
        return len(self.data.splits.train)

    @property
    def eval_dataset_size(self) -> int:
        """Rows in the held-out split, served by ``reset(evaluation=True)``."""
        return len(self.data.splits.test)

    @property
    def max_reward(self) -> float | None:
        return self.data.max_reward

    def reset(
        self,
        seed: int | None = None,
        *,
        row_index: int | None = None,
        evaluation: bool | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """Serve a row: ``row_index`` if given, else one drawn from ``seed`` (reproducibly)."""
        split_name = "test" if evaluation else "train"
        table = self.data.splits.split(evaluation)
        size = len(table)
        if row_index is None:
            if size == 0:
                raise DatasetLoadError(
                    f"the {split_name} split has no rows: use more rows or change train_test_split."
                )
            if seed is not None:
                row_index = random.Random(seed).randrange(size)
            else:
                self._rng = self._rng or random.Random()
                row_index = self._rng.randrange(size)
        elif not 0 <= row_index < size:
            raise InvalidArgument(
                f"row_index {row_index} is out of range: the {split_name} split has {size} "
                f"rows (0..{size - 1})."
            )
        self._row = table[row_index]
        messages = with_system_prompt(self.data.template.render(self._row), self.system_prompt)
        self._info = {"messages": messages, "row_index": row_index, "split": split_name}
        return user_text(messages), dict(self._info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Score ``action`` against the row; the episode ends after this one turn."""
        if self._row is None:
            raise EpisodeError("step() called before reset() (or twice): call reset() first.")
        row, self._row = self._row, None
        where = f"{self._info['split']} row {self._info['row_index']}"
        reward, components = self.data.rubric.score(action, row, self._info, where)
        info: dict[str, Any] = {"row_index": self._info["row_index"], "split": self._info["split"]}
        if components:
            info["reward_components"] = components
        if self.max_reward:
            info["accuracy"] = reward / self.max_reward
        return "", reward, True, False, info
