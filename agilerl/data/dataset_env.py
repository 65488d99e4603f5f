"""DatasetEnv: SFT and preference (DPO) data, rendered with the chat template and batched.

Nothing is generated. Every batch is a dict of tensors, right-padded to its longest example:

objective ``"sft"``:
    ``input_ids``       (B, T) long: prompt tokens then response tokens, then ``pad_token_id``.
    ``attention_mask``  (B, T) long: 1 on real tokens, 0 on padding.
    ``loss_mask``       (B, T) bool: True on response tokens only (the assistant turn, with its
                        end-of-turn tokens); False on the prompt and padding.
    ``labels``          (B, T) long: ``input_ids`` where ``loss_mask``, else -100 (not shifted:
                        HuggingFace causal-LM models shift internally).
    ``prompt_lengths``  (B,) long: prompt tokens per row; ``loss_mask`` starts at this index.
objective ``"preference"``:
    ``chosen_input_ids``, ``chosen_attention_mask``, ``chosen_loss_mask``,
    ``rejected_input_ids``, ``rejected_attention_mask``, ``rejected_loss_mask``: as above, for
    prompt + chosen and prompt + rejected.
    ``prompt_lengths``  (B,) long: row i of both starts with the same ``prompt_lengths[i]``
                        prompt tokens; each loss mask starts there.

The prompt is the ``prompt_template`` rendered per row (default: the ``prompt`` column as the user
message); the response is ``response_column`` (SFT) or ``chosen``/``rejected`` (preference),
rendered as the assistant turn. Prompt and response are tokenized separately, so the mask
boundary is exact.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agilerl.errors import DatasetLoadError, InvalidArgument
from agilerl.chat import render_chat
from agilerl.data.tables import split_table
from agilerl.data.templates import PromptTemplate, with_system_prompt

if TYPE_CHECKING:
    import numpy as np
    import torch
    from datasets import Dataset

    from agilerl.manifest.spec import EnvironmentSpec

__all__ = ["Objective", "Overlong", "TokenizedExample", "DatasetEnv"]

Objective = Literal["sft", "preference"]
Overlong = Literal["drop", "truncate"]

_LOG = logging.getLogger(__name__)
_IGNORE_INDEX = -100


@dataclass(frozen=True)
class TokenizedExample:
    """One row: its prompt tokens and one (SFT) or two (chosen, rejected) response token arrays."""

    prompt: np.ndarray
    responses: tuple[np.ndarray, ...]


class DatasetEnv:
    """Tokenized SFT or preference rows with a deterministic split and per-epoch shuffling."""

    def __init__(
        self,
        dataset: Dataset,
        tokenizer: Any,
        objective: Objective = "sft",
        *,
        prompt_template: Mapping[str, str] | None = None,
        response_column: str = "response",
        system_prompt: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        max_context_length: int | None = None,
        overlong: Overlong = "drop",
        train_test_split: float = 0.9,
        split_seed: int = 0,
        batch_size: int = 8,
        seed: int = 0,
    ) -> None:
        if objective not in ("sft", "preference"):
            raise InvalidArgument(f"objective must be 'sft' or 'preference', got {objective!r}.")
        if overlong not in ("drop", "truncate"):
            raise InvalidArgument(f"overlong must be 'drop' or 'truncate', got {overlong!r}.")
        if batch_size < 1:
            raise InvalidArgument(f"batch_size must be at least 1, got {batch_size}.")
        self.objective = objective
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.seed = seed
        self.max_context_length = max_context_length
        self.overlong = overlong
        self.template = (
            PromptTemplate.parse(prompt_template)
            if prompt_template is not None
            else PromptTemplate.single_user("prompt")
        )
        self.template.check_columns(dataset.column_names)
        self.response_columns = (
            (response_column,) if objective == "sft" else ("chosen", "rejected")
        )
        missing = [c for c in self.response_columns if c not in dataset.column_names]
        if missing:
            raise DatasetLoadError(
                f"objective {objective!r} needs column(s) {', '.join(map(repr, missing))}; the "
                f"dataset has: {', '.join(dataset.column_names)}. Rename with 'columns: "
                "{source: " + missing[0] + "}'."
            )
        self.system_prompt = system_prompt
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.pad_token_id = _pad_id(tokenizer)
        self.num_dropped = 0
        self.num_truncated = 0
        splits = split_table(dataset, train_test_split, split_seed)
        self._train = self._tokenize(splits.train, "train")
        self._test = self._tokenize(splits.test, "test")
        if self.num_dropped or self.num_truncated:
            _LOG.warning(
                "DatasetEnv: %d example(s) longer than max_context_length=%s dropped, %d "
                "truncated.",
                self.num_dropped,
                max_context_length,
                self.num_truncated,
            )

    @classmethod
    def from_spec(
        cls,
        spec: EnvironmentSpec,
        tokenizer: Any,
        *,
        base_dir: str | Path | None = None,
        max_context_length: int | None = None,
        overlong: Overlong = "drop",
        batch_size: int = 8,
        seed: int = 0,
    ) -> DatasetEnv:
        """Build from a manifest's ``environment:`` section (``env_type: dataset``; the mapping
        lives in assembly)."""
        from agilerl.assembly.datasets import dataset_env_from_spec  # the door: see [tool.importlinter]

        return dataset_env_from_spec(
            cls,
            spec,
            tokenizer,
            base_dir=base_dir,
            max_context_length=max_context_length,
            overlong=overlong,
            batch_size=batch_size,
            seed=seed,
        )

    @property
    def dataset_size(self) -> int:
        """Train examples kept after the max_context_length filter."""
        return len(self._train)

    @property
    def eval_dataset_size(self) -> int:
        """Held-out examples kept after the max_context_length filter."""
        return len(self._test)

    def num_batches(self, *, evaluation: bool = False) -> int:
        """Batches per epoch (the last may be smaller)."""
        size = self.eval_dataset_size if evaluation else self.dataset_size
        return -(-size // self.batch_size)

    def batches(
        self, epoch: int = 0, *, evaluation: bool = False
    ) -> Iterator[dict[str, torch.Tensor]]:
        """One epoch: train rows shuffled by ``(seed, epoch)``, held-out rows in order."""
        import numpy as np

        examples = self._test if evaluation else self._train
        if evaluation:
            order = np.arange(len(examples))
        else:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(examples))
        for start in range(0, len(order), self.batch_size):
            yield self.collate([examples[i] for i in order[start : start + self.batch_size]])

    def collate(self, examples: Sequence[TokenizedExample]) -> dict[str, torch.Tensor]:
        """Pad examples into the batch dict described at the top of this module."""
        import torch

        prompt_lengths = torch.tensor([len(e.prompt) for e in examples], dtype=torch.long)
        if self.objective == "sft":
            batch = self._pad([(e.prompt, e.responses[0]) for e in examples])
            labels = batch["input_ids"].masked_fill(~batch["loss_mask"], _IGNORE_INDEX)
            return {**batch, "labels": labels, "prompt_lengths": prompt_lengths}
        batch = {"prompt_lengths": prompt_lengths}
        for index, name in enumerate(("chosen", "rejected")):
            padded = self._pad([(e.prompt, e.responses[index]) for e in examples])
            batch.update({f"{name}_{key}": value for key, value in padded.items()})
        return batch

    def _pad(self, pairs: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, torch.Tensor]:
        import torch

        width = max(len(p) + len(r) for p, r in pairs)
        input_ids = torch.full((len(pairs), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(pairs), width), dtype=torch.long)
        loss_mask = torch.zeros((len(pairs), width), dtype=torch.bool)
        for i, (prompt, response) in enumerate(pairs):
            end = len(prompt) + len(response)
            input_ids[i, : len(prompt)] = torch.from_numpy(prompt)
            input_ids[i, len(prompt) : end] = torch.from_numpy(response)
            attention_mask[i, :end] = 1
            loss_mask[i, len(prompt) : end] = True
        return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}

    def _tokenize(self, table: Dataset, split_name: str) -> list[TokenizedExample]:
        """Render and tokenize every row once; apply the max_context_length policy."""
        import numpy as np

        prompt_texts: list[str] = []
        response_texts: list[list[str]] = [[] for _ in self.response_columns]
        for index, row in enumerate(table):
            messages = with_system_prompt(self.template.render(row), self.system_prompt)
            prompt_text = self._render(messages, add_generation_prompt=True)
            prompt_texts.append(prompt_text)
            for column, texts in zip(self.response_columns, response_texts):
                texts.append(
                    self._response_text(messages, prompt_text, row, column, split_name, index)
                )
        prompts = self._encode(prompt_texts)
        responses = [self._encode(texts) for texts in response_texts]
        examples = []
        for index, prompt_ids in enumerate(prompts):
            kept = self._fit(prompt_ids, [r[index] for r in responses])
            if kept is not None:
                examples.append(
                    TokenizedExample(
                        np.asarray(prompt_ids, dtype=np.int64),
                        tuple(np.asarray(r, dtype=np.int64) for r in kept),
                    )
                )
        return examples

    def _response_text(
        self,
        messages: list[dict[str, str]],
        prompt: str,
        row: Mapping[str, Any],
        column: str,
        split_name: str,
        index: int,
    ) -> str:
        """The text the assistant turn adds after the rendered prompt."""
        value = row[column]
        if not isinstance(value, str):
            raise DatasetLoadError(
                f"column {column!r} holds {type(value).__name__} on {split_name} row {index}; "
                "it must be text."
            )
        full = self._render([*messages, {"role": "assistant", "content": value}])
        if not full.startswith(prompt):
            raise DatasetLoadError(
                "the chat template renders the prompt differently once the assistant turn is "
                f"added ({split_name} row {index}), so the response cannot be masked exactly; "
                "use a template whose generation prompt is a prefix of the full chat."
            )
        return full[len(prompt) :]

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        return render_chat(self.tokenizer, messages, add_generation_prompt=add_generation_prompt, **self.chat_template_kwargs)

    def _encode(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def _fit(self, prompt: list[int], responses: list[list[int]]) -> list[list[int]] | None:
        """Apply max_context_length: keep, truncate the responses, or drop (None)."""
        limit = self.max_context_length
        if limit is None or len(prompt) + max(map(len, responses)) <= limit:
            return responses
        if self.overlong == "drop" or len(prompt) >= limit:
            self.num_dropped += 1
            return None
        self.num_truncated += 1
        return [r[: limit - len(prompt)] for r in responses]


def _pad_id(tokenizer: Any) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    return 0
