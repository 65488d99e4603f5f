"""The manifest's ``model:``, ``algorithm:`` and ``training:`` sections, typed.

Unknown keys are errors here (unlike ``environment:``): a misspelt ``learning_rate`` silently
left at its default wastes a whole training run.
"""

from __future__ import annotations

from typing import Any, Literal

import typing

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

__all__ = [
    "MAX_SEED",
    "MAX_BATCH_SIZE",
    "MAX_GROUP_SIZE",
    "MAX_ROLLOUTS_PER_STEP",
    "MAX_NEW_TOKENS",
    "MAX_EVAL_EPISODES",
    "ManifestModel",
    "LoraSettings",
    "ModelSettings",
    "AlgorithmSettings",
    "GenerationSettings",
    "TrainingSettings",
]

MAX_SEED = 2**32 - 1
"""Seeds reach torch, numpy and envs' own generators; numpy's legacy seeding (``np.random.seed``,
used by many envs) is the narrowest range of them."""


class ManifestModel(BaseModel):
    """What every manifest section takes: values training can use as given. Floats are finite
    (no ``.inf``/``.nan``) and a number is never a bool (YAML's ``true`` would be read as 1)."""

    model_config = ConfigDict(allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _wants_number(field.annotation):
            raise ValueError(f"expected a number, got the bool {str(value).lower()!r}")
        return value


def _wants_number(annotation: Any) -> bool:
    """``annotation`` takes an int or a float, and no bool."""
    found: set[Any] = set()
    pending = [annotation]
    while pending:
        item = pending.pop()
        found.add(item)
        pending.extend(typing.get_args(item))
    return bool(found & {int, float}) and bool not in found


class _Strict(ManifestModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class LoraSettings(_Strict):
    """Train low-rank adapters (peft) instead of every weight."""

    r: int = Field(8, ge=1, description="Adapter rank.")
    alpha: int = Field(16, ge=1, description="Adapter scaling numerator (lora_alpha).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter input.")
    target_modules: str | list[str] = Field(
        "all-linear", description="Module names to adapt, or 'all-linear'."
    )


class ModelSettings(_Strict):
    """The ``model:`` section: which causal LM and tokenizer to train."""

    name_or_path: str = Field(
        "tiny",
        description="'tiny' (built-in, offline), a local folder or .gguf file (relative to the "
        "manifest; GGUF needs agilerl-envlayer[gguf]) or a hub id.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Weights' dtype when loading a pretrained model."
    )
    lora: LoraSettings | None = Field(None, description="Set to train LoRA adapters (needs peft).")
    max_model_len: int | None = Field(
        None, ge=2, description="Context length; defaults to the model's max_position_embeddings."
    )
    max_images: int = Field(
        16, ge=1, description="A vision model's most images per conversation (an episode past it fails)."
    )
    max_image_pixels: int = Field(
        2048 * 2048, ge=1, description="A vision model's most pixels per image (a bigger one fails its episode)."
    )


class AlgorithmSettings(BaseModel):
    """The ``algorithm:`` section: ``name`` plus the algorithm's own options (checked by it)."""

    model_config = ConfigDict(extra="allow")

    name: str = Field("grpo", description="A registered algorithm (agilerl algorithms list).")

    @property
    def options(self) -> dict[str, Any]:
        """Everything but ``name``: the algorithm's config validates it."""
        return dict(self.model_extra or {})

    def as_mapping(self) -> dict[str, Any]:
        return {"name": self.name, **self.options}


class GenerationSettings(BaseModel):
    """The ``generation:`` section: ``backend`` plus the backend's own options (checked by it)."""

    model_config = ConfigDict(extra="allow")

    backend: str = Field(
        "transformers",
        description="A registered generation backend: 'transformers' (default), 'vllm', or a plugin's "
        "(agilerl backends list).",
    )

    @property
    def options(self) -> dict[str, Any]:
        """Everything but ``backend``: the backend validates it."""
        return dict(self.model_extra or {})


MAX_BATCH_SIZE = 65_536
MAX_GROUP_SIZE = 4_096
MAX_ROLLOUTS_PER_STEP = 1_048_576
MAX_NEW_TOKENS = 1_048_576
MAX_EVAL_EPISODES = 1_048_576
_SIZE_BOUNDS = {
    "batch_size": (MAX_BATCH_SIZE, "a larger step takes gradient_accumulation_steps or more processes"),
    "group_size": (MAX_GROUP_SIZE, "group-relative algorithms compare tens of rollouts per task, not millions"),
    "max_new_tokens": (MAX_NEW_TOKENS, "no model's context holds more (model.max_model_len bounds it further)"),
    "eval_episodes": (MAX_EVAL_EPISODES, "an evaluation's episodes are held at once; lower it"),
}
"""Sizes that allocate in proportion (envs, token buffers, results): a value past its bound is a
typo or a unit slip (10**9), refused by validation with its fix, never a ``MemoryError`` mid-run."""


class TrainingSettings(_Strict):
    """The ``training:`` section: the loop's budget, optimiser and bookkeeping."""

    batch_size: int = Field(
        8, ge=1, le=MAX_BATCH_SIZE, description="Tasks (rollout) or rows (dataset) per step, per process."
    )
    group_size: int = Field(
        8, ge=1, le=MAX_GROUP_SIZE, description="Rollouts per task (GRPO group); rollout only."
    )
    max_steps: int = Field(100, ge=1, description="Optimiser steps in total (a resumed run counts on).")
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float | None = Field(1.0, gt=0, description="Gradient clipping; null disables.")
    micro_batch_size: int | None = Field(
        None, ge=1,
        description="Rows per forward/backward pass (gradients accumulate over the step's batch); "
        "rollout: a multiple of group_size. Null: the whole batch at once.",
    )
    gradient_accumulation_steps: int = Field(
        1, ge=1,
        description="Batches collected and back-propagated per optimiser step (each batch_size "
        "tasks or rows per process); gradients are synchronised across processes once per step.",
    )
    mixed_precision: Literal["no", "bf16", "fp16"] = Field(
        "no",
        description="accelerate's autocast for forward passes: 'bf16' (CPUs and recent GPUs), "
        "'fp16' (GPUs, with a gradient scaler) or 'no'. Weights stay in model.dtype.",
    )
    max_new_tokens: int = Field(
        256, ge=1, le=MAX_NEW_TOKENS, description="Tokens generated per turn at most."
    )
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling; 1 disables.")
    top_k: int = Field(0, ge=0, description="Top-k sampling; 0 disables.")
    evaluation_interval: int = Field(
        10, ge=0, description="Evaluate every N steps (and at the end); 0 never."
    )
    stop_at_eval_reward: float | None = Field(
        None,
        description="End the run after an evaluation whose eval/reward reaches this (a solved task "
        "needs no more steps); it ends as at max_steps, saved. Rollout algorithms only; null: run to max_steps.",
    )
    eval_episodes: int = Field(
        8, ge=1, le=MAX_EVAL_EPISODES,
        description="Greedy episodes per evaluation of an env without a held-out split.",
    )
    checkpoint_interval: int = Field(
        0, ge=0,
        description="Save a checkpoint every N steps; 0: by checkpoint_minutes only. A run also saves "
        "at the end and whenever it stops early (Ctrl-C, SIGTERM, an error).",
    )
    checkpoint_minutes: float | None = Field(
        30, gt=0,
        description="Save a checkpoint when this many minutes passed since the last one (a crash "
        "loses at most that much work); null: by checkpoint_interval only.",
    )
    keep_last: int | None = Field(
        3, ge=1, description="Checkpoints kept; older ones are deleted after each save (the newest "
        "always stays). Null keeps all.",
    )
    seed: int = Field(
        0, ge=0, le=MAX_SEED, description="Seeds the model init (tiny), tasks and sampling; 0 to 2**32 - 1."
    )
    deterministic: bool | None = Field(
        None,
        description="torch's deterministic algorithms (docs/training.md, Reproducibility). Null: on "
        "when training on a CPU, so a seeded run repeats its metrics exactly; off on GPUs, where they "
        "cost speed. True: on for every device (CUBLAS_WORKSPACE_CONFIG set if unset); an op with no "
        "deterministic implementation then fails naming itself. False: off.",
    )
    output_dir: str = Field(
        "runs/latest",
        description="Metrics, plot and checkpoints, relative to the working directory "
        "(agilerl train defaults to runs/<the manifest's folder name>).",
    )
    resume_from: str | None = Field(
        None, description="A checkpoint folder, or 'latest' (the newest under output_dir)."
    )
    max_context_length: int | None = Field(
        None, ge=2, description="Dataset rows longer than this are dropped."
    )
    report_to: list[str] = Field(
        default_factory=list,
        description="Experiment trackers that get the metrics too (accelerate's): tensorboard, "
        "wandb, trackio, mlflow, aim, comet_ml, clearml, dvclive, swanlab, or a plugin's "
        "(agilerl trackers list). A single name is a list of one; 'none' or empty: metrics.jsonl only.",
    )
    project: str = Field(
        "agilerl", min_length=1,
        description="The trackers' project (wandb's project, trackio's, mlflow's experiment).",
    )
    run_name: str | None = Field(
        None, min_length=1,
        description="The run's name in the trackers; defaults to output_dir's folder name.",
    )

    rollout_mode: Literal["sync", "async"] = Field(
        "sync",
        description="'sync': collect a batch, update, repeat (generation waits for the update). "
        "'async': generation and env I/O never stop; the trainer takes finished groups from a "
        "bounded queue (docs/async.md). Rollout only.",
    )
    max_staleness: int = Field(
        1, ge=0,
        description="async: every generated token that enters an update was produced by weights at "
        "most this many optimiser steps older than the weights being updated (0: on-policy).",
    )
    task_sampling: Literal["uniform", "adaptive"] = Field(
        "uniform",
        description="'uniform': every row in turn, each epoch reshuffled (seeds at random); "
        "'adaptive': rows (seed buckets without rows) whose groups were informative, their rewards "
        "differing, are drawn more often (docs/collector.md). Rollout only.",
    )
    task_sampling_floor: float = Field(
        0.25, gt=0, le=1,
        description="adaptive: this share of draws is uniform, so every task keeps at least this "
        "fraction of its uniform chance (solved and hopeless rows come back).",
    )
    record_rollouts: Literal["all"] | int = Field(
        8,
        description="Samples written to <output_dir>/rollouts.jsonl each step (tokens, turns, tool "
        "calls, images, reward parts; agilerl view shows them): 'all', N per step, or 0 for none. "
        "Rollout only.",
    )

    @field_validator("record_rollouts", mode="before")
    @classmethod
    def _records_count(cls, value: Any) -> Any:
        """``all``, or a count of samples per step that is not negative."""
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise ValueError(f"{value} is negative; give 'all', a number of samples per step, or 0 for none")
        if isinstance(value, str) and value != "all":
            raise ValueError(f"{value!r} is not 'all'; give 'all', a number of samples per step, or 0 for none")
        return value

    @field_validator(*_SIZE_BOUNDS, mode="before")
    @classmethod
    def _size_fits(cls, value: Any, info: ValidationInfo) -> Any:
        """A size past its bound allocates past any machine's memory (a bare ``MemoryError``
        mid-run): refused here, with the bound and the way to a larger run."""
        bound, fix = _SIZE_BOUNDS[info.field_name or ""]
        if isinstance(value, int | float) and not isinstance(value, bool) and value > bound:
            raise ValueError(f"{value:,} is past the bound of {bound:,}; {fix}")
        return value

    @model_validator(mode="after")
    def _rollouts_fit(self) -> TrainingSettings:
        """Each collection holds ``batch_size x group_size`` rollouts (envs, token lists) at once;
        async mode ``max_staleness + 1`` times as many (a lane per group the bound admits)."""
        rollouts = self.batch_size * self.group_size
        lanes = self.max_staleness + 1 if self.rollout_mode == "async" else 1
        if rollouts * lanes > MAX_ROLLOUTS_PER_STEP:
            held = f" x (max_staleness {self.max_staleness:,} + 1)" if lanes > 1 else ""
            raise ValueError(
                f"batch_size {self.batch_size:,} x group_size {self.group_size:,}{held} is {rollouts * lanes:,} "
                f"rollouts held at once, past the bound of {MAX_ROLLOUTS_PER_STEP:,}; lower one of "
                "them (gradient_accumulation_steps or more processes train on more per step)"
            )
        return self

    @model_validator(mode="after")
    def _async_fits(self) -> TrainingSettings:
        """Combinations the async pipeline cannot honour, named with their fix."""
        if self.rollout_mode == "sync" and "max_staleness" in self.model_fields_set:
            raise ValueError(
                f"max_staleness={self.max_staleness} applies to rollout_mode: async only (sync training "
                "is always on-policy); set rollout_mode: async or remove max_staleness"
            )
        return self

    @model_validator(mode="after")
    def _stop_needs_evaluations(self) -> TrainingSettings:
        """A target that is never evaluated would silently never stop the run."""
        if self.stop_at_eval_reward is not None and self.evaluation_interval == 0:
            raise ValueError(
                f"stop_at_eval_reward={self.stop_at_eval_reward} is checked at evaluations, and "
                "evaluation_interval is 0 (never); set evaluation_interval or remove stop_at_eval_reward"
            )
        return self

    @model_validator(mode="after")
    def _floor_needs_adaptive(self) -> TrainingSettings:
        """A floor set for uniform sampling would silently do nothing."""
        if self.task_sampling == "uniform" and "task_sampling_floor" in self.model_fields_set:
            raise ValueError(
                f"task_sampling_floor={self.task_sampling_floor} applies to task_sampling: adaptive only "
                "(uniform draws every task alike); set task_sampling: adaptive or remove task_sampling_floor"
            )
        return self

    @field_validator("report_to", mode="before")
    @classmethod
    def _one_name_is_a_list(cls, value: Any) -> Any:
        """``report_to: wandb`` as TRL takes it; ``none`` switches tracking off."""
        if isinstance(value, str):
            value = [value]
        return [] if value == ["none"] else value
