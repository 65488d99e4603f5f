"""Any agilerl env inside TRL's ``GRPOTrainer``, through its ``rollout_func`` route.

TRL (>= 1.16) calls ``rollout_func(prompts, trainer)`` with the prompts of this process's share
of the batch (each GRPO group's prompt repeated ``num_generations`` times, in a row) and trains on
the token ids it returns. ``EnvRollout`` plays each prompt's task as a whole multi-turn episode
through ``RolloutCollector`` (so through ``RolloutHarness``: token-exact turns, one batched
``generate`` per turn, envs stepped at once) and returns the conversation after the opening
prompt as the completion, with the env's tokens masked out of the loss (``env_mask``) and the
episode's reward for ``env_reward``:

    from trl import GRPOConfig, GRPOTrainer
    from agilerl.integrations.trl import EnvRollout, env_reward

    rollout = EnvRollout("guess")               # or "module:attr", "env.py:Env", a URL, a manifest
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=GRPOConfig(...),
                          train_dataset=rollout.dataset(64), reward_funcs=env_reward,
                          rollout_func=rollout)

Which task a prompt plays: ``rollout.dataset(n)`` writes prompts ``"agilerl task <seed>"``; any
other prompt text (a dataset of your own) plays the seed its CRC-32 gives. Equal prompts play the
same task, so a GRPO group compares like with like. Dataset envs play row ``seed % dataset_size``.

Tool calls: ``EnvRollout(env, tool_parser="hermes")`` (or ``auto``, or the manifest's
``environment.tool_parser``) parses the model's calls in its own format with agilerl's parsers,
on the generated ids, runs them as the env's ``call_tool`` and renders the results in the ``tool``
role; the completion TRL trains on is still exactly the generated tokens plus the env's, masked.
Why not TRL's ``environment_factory``: it turns a class's Python methods into tools and parses
the calls with its own response schema per family. Here one parser set serves training, eval and
TRL alike, for every kind of env (an MCP server, a text env with ``call_tool``); choose
``environment_factory`` for an env written for TRL as Python methods.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agilerl.errors import InvalidArgument

if TYPE_CHECKING:
    from datasets import Dataset

    from agilerl.envs.client import EnvClient
    from agilerl.manifest.spec import EnvironmentSpec
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.generation.policy import Policy
    from agilerl.rollout.trajectory import Trajectory

__all__ = ["EnvRollout", "env_reward", "task_prompt"]

_TASK = re.compile(r"agilerl task (\d+)")


def task_prompt(seed: int) -> str:
    """The dataset prompt that plays the env's task ``seed``."""
    return f"agilerl task {seed}"


def env_reward(completions: Sequence[Any], env_reward: Sequence[float | None], **_: Any) -> list[float | None]:
    """TRL reward function: each episode's total env reward (None, unscored, for a failed one)."""
    return list(env_reward)


class EnvRollout:
    """A TRL ``rollout_func`` over the env ``env`` names (see the module doc)."""

    def __init__(
        self,
        env: str | dict[str, Any] | EnvironmentSpec,
        *,
        env_config: dict[str, Any] | None = None,
        max_turns: int | None = None,
        max_new_tokens: int | None = None,
        base_dir: str | Path | None = None,
        policy: Policy | None = None,
        tool_parser: str | None = None,
    ) -> None:
        """``env``: a registered name, ``module:attr``, ``file.py:attr``, an ``http(s)://`` or
        ``ws(s)://`` URL of a served env, a manifest file, or a manifest's ``environment:``
        section (a mapping or ``EnvironmentSpec``).

        ``max_new_tokens`` is per turn (default: the trainer's ``max_completion_length``);
        ``policy`` generates instead of the trainer's model (any ``Policy``, e.g. a vLLM backend).
        ``tool_parser`` (``hermes``, ..., ``auto``) runs the model's tool calls as the env's ``call_tool``.
        """
        self.spec, self.base_dir = _spec(env, env_config, max_turns, base_dir, tool_parser)
        self.max_new_tokens = max_new_tokens
        self.policy = policy
        self._collector: RolloutCollector | None = None
        self._first_env: EnvClient | None = None
        """The env ``dataset()`` read ``dataset_size`` off, kept for the collector's first slot."""
        self._tokenizer: Any = None
        self.last_batch: list[Trajectory] = []
        """The episodes of the latest call, in prompt order (for logging and tests)."""

    @classmethod
    def from_manifest(cls, path: str | Path, **kwargs: Any) -> EnvRollout:
        """The env of a manifest's ``environment:`` section (paths relative to its folder)."""
        from agilerl.manifest.spec import load_manifest

        manifest = load_manifest(path)
        return cls(manifest.environment, base_dir=manifest.base_dir, **kwargs)

    def dataset(self, num_tasks: int | None = None, *, first_seed: int = 0) -> Dataset:
        """A ``train_dataset`` of ``num_tasks`` task prompts (default: every row of a dataset env)."""
        from datasets import Dataset

        if num_tasks is None:
            num_tasks = self._dataset_size()
            if num_tasks is None:
                raise InvalidArgument("this env has no dataset_size: pass dataset(num_tasks=...)")
        if num_tasks < 1:
            raise InvalidArgument(f"num_tasks must be >= 1, got {num_tasks}")
        return Dataset.from_dict({"prompt": [task_prompt(first_seed + i) for i in range(num_tasks)]})

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list[Any]]:
        """Play one episode per prompt; return what TRL trains on (the module doc says what)."""
        from agilerl.rollout.assigner import Task
        from agilerl.generation.policy import TransformersPolicy

        collector = self._collector_for(len(prompts), trainer)
        size = collector.assigner.dataset_size
        tasks = []
        for prompt in prompts:
            seed = _seed_of(prompt)
            tasks.append(Task(seed, seed % size if size else None))
        policy = self.policy or TransformersPolicy(trainer.accelerator.unwrap_model(trainer.model), self._tokenizer)
        batch = collector.play(tasks, policy)
        self.last_batch = batch.trajectories
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "env_reward": []}
        for traj in batch.trajectories:
            for key, value in self._completion(traj).items():
                out[key].append(value)
        return out

    def close(self) -> None:
        """Close every env the rollouts opened."""
        if self._collector is not None:
            self._collector.close()
            self._collector = None
        if self._first_env is not None:
            self._first_env.close()
            self._first_env = None

    def __enter__(self) -> EnvRollout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _collector_for(self, num_prompts: int, trainer: Any) -> RolloutCollector:
        """The collector, with a slot for each prompt (rebuilt when a call brings more)."""
        from agilerl.rollout.collector import RolloutCollector
        from agilerl.generation.policy import SamplingParams

        if self._collector is not None and self._collector.num_slots >= num_prompts:
            return self._collector
        if self._collector is not None:
            self._collector.close()
        args = trainer.args
        self._tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        sampling = SamplingParams(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k or 0,
            max_new_tokens=self.max_new_tokens or args.max_completion_length,
        )
        first_env, self._first_env = self._first_env, None
        self._collector = RolloutCollector.from_spec(
            self.spec, self._tokenizer, batch_size=num_prompts, group_size=1, base_dir=self.base_dir,
            sampling=sampling, seed=args.seed, first_env=first_env,
        )
        return self._collector

    def _dataset_size(self) -> int | None:
        """The env's ``dataset_size``, read off the env the collector's first slot will play (no
        collector exists yet, and none is built only to be looked at)."""
        from agilerl.assembly.env_factory import make_env_factory
        from agilerl.envs.client import as_client

        if self._first_env is None:
            self._first_env = as_client(make_env_factory(self.spec, base_dir=self.base_dir)())
        return self._first_env.describe().dataset_size

    def _completion(self, traj: Trajectory) -> dict[str, Any]:
        """One episode as TRL's row: the opening prompt, the rest as the completion, env tokens
        masked (0 in ``env_mask``), log-probs 0.0 off the policy's tokens."""
        opening = next((i for i, turn in enumerate(traj.turn_ids) if turn >= 0), len(traj.token_ids))
        if opening == 0 or opening == len(traj.token_ids):  # reset failed, or nothing was generated
            filler = self._tokenizer.eos_token_id if self._tokenizer.eos_token_id is not None else 0
            return {
                "prompt_ids": traj.token_ids[:opening] or [filler],
                "completion_ids": [filler],
                "logprobs": [0.0],
                "env_mask": [0],
                "env_reward": None,
            }
        completion = traj.token_ids[opening:]
        logprobs = traj.logprobs[opening:] if traj.logprobs is not None else [0.0] * len(completion)
        reward = traj.total_reward if traj.error is None and math.isfinite(traj.total_reward) else None
        return {
            "prompt_ids": traj.token_ids[:opening],
            "completion_ids": completion,
            "logprobs": logprobs,
            "env_mask": [int(m) for m in traj.action_mask[opening:]],
            "env_reward": reward,
        }


def _seed_of(prompt: Any) -> int:
    """The task seed of a dataset prompt: ``task_prompt``'s own, else the text's CRC-32."""
    text = prompt if isinstance(prompt, str) else str(prompt[-1].get("content", "")) if prompt else ""
    match = _TASK.fullmatch(text.strip())
    return int(match.group(1)) if match else zlib.crc32(text.encode())


def _spec(
    env: str | dict[str, Any] | EnvironmentSpec,
    env_config: dict[str, Any] | None,
    max_turns: int | None,
    base_dir: str | Path | None,
    tool_parser: str | None = None,
) -> tuple[EnvironmentSpec, str | Path | None]:
    """The ``environment:`` section ``env`` names, with the keyword overrides applied."""
    from agilerl.manifest.spec import EnvironmentSpec, load_manifest, parse_env_spec

    if isinstance(env, str) and Path(env).suffix in (".yaml", ".yml") and Path(env).is_file():
        manifest = load_manifest(env)
        env, base_dir = manifest.environment, base_dir or manifest.base_dir
    if isinstance(env, EnvironmentSpec):
        fields = env.model_dump(by_alias=True, exclude_unset=True)
    elif isinstance(env, dict):
        fields = {"env_type": "rollout", **env}
    elif isinstance(env, str):
        source = "env_url" if env.split("://", 1)[0] in ("http", "https", "ws", "wss") else "entrypoint"
        fields = {"env_type": "rollout", source: env}
    else:
        raise InvalidArgument(
            f"env must be a registered name, entrypoint, URL, manifest path or environment section, got {env!r}"
        )
    if env_config is not None:
        fields["env_config"] = env_config
    if max_turns is not None:
        fields["max_turns"] = max_turns
    if tool_parser is not None:
        fields["tool_parser"] = tool_parser
    return parse_env_spec(fields), base_dir
