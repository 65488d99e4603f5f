"""The training loops: ``train_llm_rollout`` (the model acts in envs) and ``train_llm_dataset``
(SFT/DPO batches). Both share one trainer: optimiser, metrics, evaluation, checkpoints, and a
Ctrl-C that saves before it stops. Underneath is accelerate (``distributed.py``): one process,
DDP or FSDP as ``accelerate launch`` says, mixed precision and sharded checkpoints.

    model, tokenizer = load_model_and_tokenizer(ModelSettings(name_or_path="tiny"))
    collector = RolloutCollector(GuessEnv, tokenizer, batch_size=8, group_size=8, seed=0)
    result = train_llm_rollout(model, tokenizer, collector, "grpo", TrainingSettings(max_steps=50))
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agilerl.agents.metrics import agent_metrics
from agilerl.errors import InvalidArgument
from agilerl.manifest.settings import TrainingSettings
from agilerl.tools.metrics import TOOL_STATS_KEY, tool_call_metrics
from agilerl.train.algorithm import Algorithm, build_algorithm
from agilerl.train.compatibility import EnvSource, check_compatible
from agilerl.train.distributed import World, gathered_weights
from agilerl.train.metrics import judge_metrics, reward_component_metrics
from agilerl.train.trainer import Trainer, TrainResult, by_rank

if TYPE_CHECKING:
    from agilerl.data.dataset_env import DatasetEnv
    from agilerl.generation.policy import Policy
    from agilerl.rollout.collector import RolloutCollector

__all__ = [
    "AlgorithmRef",
    "TrainResult",
    "train_llm_rollout",
    "train_llm_dataset",
]

AlgorithmRef = Algorithm[Any] | str | Mapping[str, Any]


def train_llm_rollout(
    model: Any,
    tokenizer: Any,
    collector: RolloutCollector,
    algorithm: AlgorithmRef = "grpo",
    training: TrainingSettings | Mapping[str, Any] | None = None,
    *,
    resume_from: str | Path | None = None,
    max_model_len: int | None = None,
    show_progress: bool = True,
    generation: Policy | None = None,
    env_placement: str | None = None,
) -> TrainResult:
    """Collect a batch of grouped rollouts, take one optimiser step on it, repeat.

    ``algorithm`` is an ``Algorithm``, a registered name or an ``algorithm:`` mapping.
    ``resume_from`` is a checkpoint folder whose weights ``model`` was loaded from; the
    optimiser, the step count and the task stream continue from it. ``max_model_len`` bounds
    the conversation (default: the model's ``max_position_embeddings``). ``generation`` is the
    policy that collects (default: ``TransformersPolicy`` on ``model``); one holding its own copy
    of the weights (a ``WeightSyncedPolicy``: vLLM) gets them after every optimiser step.
    ``env_placement`` says where the env runs, on the run's header (``env: ...``).
    """
    from agilerl.generation.backends import WeightSyncedPolicy
    from agilerl.rollout.pipeline import RolloutPipeline, stall_bound
    from agilerl.generation.policy import TransformersPolicy
    from agilerl.generation.versioned import InferenceCopy, VersionedPolicy
    from agilerl.train.batch import collate_trajectories
    from agilerl.train.checkpoint import read_state

    algo = _algorithm(algorithm)
    check_compatible(algo, EnvSource("rollout", kind_field="train_llm_rollout"), collector.sampling)
    settings = _settings(training)
    if settings.micro_batch_size and settings.micro_batch_size % collector.group_size:
        raise InvalidArgument(
            f"training.micro_batch_size {settings.micro_batch_size} is not a multiple of group_size "
            f"{collector.group_size}: a micro-batch must hold whole groups to compare them."
        )
    trainer = Trainer(model, tokenizer, algo, settings, resume_from, show_progress)
    trainer.env_placement = env_placement
    if trainer.world.is_main and settings.record_rollouts != 0:  # rank 0's samples (docs/viewer.md)
        from agilerl.train.records import RolloutRecorder

        trainer.records = RolloutRecorder(trainer.output_dir, tokenizer, settings.record_rollouts, start_step=trainer.step)
    generator = generation or TransformersPolicy(model, tokenizer, max_model_len=max_model_len)
    if settings.rollout_mode == "async" and isinstance(generator, TransformersPolicy) and generator.model is model:
        # generation goes on during the update: it needs weights of its own (docs/async.md)
        generator = InferenceCopy.of(model, tokenizer, max_model_len=generator.max_model_len)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    trainer.synced = generator if isinstance(generator, WeightSyncedPolicy) else None
    # a synced policy generates from its own weights: the trainer's need no gathering
    own_weights = contextlib.nullcontext if trainer.synced else lambda: gathered_weights(trainer.policy)
    # a push waits for the running generation as long as the pipeline waits for a lane
    policy = trainer.versioned = VersionedPolicy(generator, version=trainer.step, publish_timeout_s=stall_bound(collector))
    if settings.task_sampling != collector.assigner.sampling:  # before the first draw
        collector.assigner = collector.assigner.with_sampling(settings.task_sampling, floor=settings.task_sampling_floor)
    pipeline = RolloutPipeline(
        collector, policy, mode=settings.rollout_mode, max_staleness=settings.max_staleness,
        groups_per_step=collector.batch_size * settings.gradient_accumulation_steps,
    )
    trainer.rollout_state = lambda: {**pipeline.state(), "tasks": collector.assigner.state_dict()}
    trainer.rollouts_trained = pipeline.trained
    saved = (read_state(resume_from).get("rollout") or []) if resume_from is not None else []
    mine = saved[trainer.world.rank] if trainer.world.rank < len(saved) else {}
    if "tasks" in mine:  # adaptive draws follow outcomes: the stream is restored, then passed over
        collector.assigner.load_state_dict(mine["tasks"])
    pipeline.resume(trainer.step, mine)  # a resumed run plays on

    from agilerl.fleet.fleet import fleet_metrics

    def next_batch() -> tuple[Any, dict[str, float]]:
        with own_weights(), trainer.accelerator.autocast():
            rollouts, metrics = pipeline.take()
        if trainer.records is not None:
            trainer.records.add(rollouts.trajectories, version=trainer.step)
        assigner = collector.assigner  # adaptive task sampling counts the step's groups, every rank's
        assigner.observe(rollouts.trajectories)
        if assigner.adaptive is not None and trainer.world.world_size > 1:
            assigner.merge([r["pending"] for r in by_rank(trainer.accelerator, {"pending": assigner.pending})])
        batch = collate_trajectories(rollouts.trajectories, pad_id).to(trainer.device)
        metrics = {**metrics, **fleet_metrics()}  # envs/replicas, replaced, sessions, start_s (with a fleet)
        finished = (t.info.get("reward_components") for t in rollouts.trajectories if t.error is None)
        tool_stats = (t.info.get(TOOL_STATS_KEY) for t in rollouts.trajectories if t.error is None)
        return batch, {
            **metrics, **reward_component_metrics(finished), **tool_call_metrics(tool_stats), **judge_metrics(),
            **agent_metrics(rollouts.trajectories),
        }

    def evaluate() -> dict[str, float]:
        with own_weights():  # every rank gathers; rank 0 alone plays
            if not trainer.world.is_main:
                return {}
            result = collector.evaluate(policy, num_episodes=settings.eval_episodes)
        metrics = {
            "eval/reward": result.mean_reward,
            "eval/failures": float(result.failures),  # episodes lost, after retries replays
            "eval/retries": float(result.retries),
        }
        if result.accuracy is not None:
            metrics["eval/accuracy"] = result.accuracy
        return metrics

    with pipeline:
        return trainer.run(next_batch, evaluate, curves=("train/reward", "eval/reward"), plot_name="reward_curve.png")


def train_llm_dataset(
    model: Any,
    tokenizer: Any,
    dataset: DatasetEnv,
    algorithm: AlgorithmRef = "sft",
    training: TrainingSettings | Mapping[str, Any] | None = None,
    *,
    resume_from: str | Path | None = None,
    show_progress: bool = True,
) -> TrainResult:
    """Step through ``dataset``'s shuffled epochs (SFT or DPO batches) until ``max_steps``.

    Each rank takes every ``world_size``-th batch; evaluation is the mean loss (and the
    algorithm's metrics) over the held-out split.
    """
    algo = _algorithm(algorithm)
    source = EnvSource("dataset", dataset.objective, "train_llm_dataset", "DatasetEnv(objective=...)")
    check_compatible(algo, source)
    settings = _settings(training)
    if settings.rollout_mode == "async":
        raise InvalidArgument(
            "training.rollout_mode: async applies to rollout envs (the model generates); a dataset "
            "env's batches are read, not generated: remove rollout_mode (or set it to sync)."
        )
    if settings.stop_at_eval_reward is not None:
        raise InvalidArgument(
            f"training.stop_at_eval_reward ({settings.stop_at_eval_reward}) needs an eval/reward: a "
            f"dataset env's evaluation is the {type(algo).__name__} loss on held-out rows; remove stop_at_eval_reward."
        )
    trainer = Trainer(model, tokenizer, algo, settings, resume_from, show_progress)
    batches = _dataset_batches(
        dataset, trainer.world, skip=trainer.step * settings.gradient_accumulation_steps
    )

    def next_batch() -> tuple[Any, dict[str, float]]:
        return {k: v.to(trainer.device) for k, v in next(batches).items()}, {}

    def evaluate() -> dict[str, float]:
        import torch

        totals: dict[str, float] = {}
        count = 0
        trainer.policy.eval()
        with torch.no_grad(), gathered_weights(trainer.policy, trainer.reference):
            if not trainer.world.is_main:
                trainer.policy.train()
                return {}
            for batch in dataset.batches(evaluation=True):
                batch = {k: v.to(trainer.device) for k, v in batch.items()}
                _, metrics = algo.loss(trainer.bare_policy, batch, trainer.reference)
                for key, value in metrics.items():
                    totals[key] = totals.get(key, 0.0) + value
                count += 1
        trainer.policy.train()
        return {f"eval/{k}": v / count for k, v in totals.items()} if count else {}

    return trainer.run(next_batch, evaluate, curves=("train/loss", "eval/loss"), plot_name="loss_curve.png")


def _algorithm(ref: AlgorithmRef) -> Algorithm[Any]:
    return ref if isinstance(ref, Algorithm) else build_algorithm({"name": ref} if isinstance(ref, str) else ref)


def _settings(training: TrainingSettings | Mapping[str, Any] | None) -> TrainingSettings:
    if isinstance(training, TrainingSettings):
        return training
    from pydantic import ValidationError

    from agilerl.errors import ConfigError
    from agilerl.manifest.spec import format_validation_error

    try:
        return TrainingSettings.model_validate(dict(training or {}))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, "training"), "training settings") from None


def _dataset_batches(dataset: DatasetEnv, world: World, *, skip: int) -> Iterator[dict[str, Any]]:
    """Endless batches, epoch after epoch; rank r takes batches r, r + world_size, ...;
    the first ``skip`` (steps already trained) are passed over."""
    if dataset.num_batches() < world.world_size:
        raise InvalidArgument(
            f"the dataset has {dataset.num_batches()} batch(es) per epoch, fewer than the "
            f"{world.world_size} ranks; lower training.batch_size or use fewer processes."
        )
    per_epoch = dataset.num_batches() // world.world_size  # equal shares keep ranks in step
    epoch, seen = 0, 0
    while True:
        for index, batch in enumerate(dataset.batches(epoch)):
            mine = index % world.world_size == world.rank and index // world.world_size < per_epoch
            if mine:
                seen += 1
                if seen > skip:
                    yield batch
        epoch += 1

