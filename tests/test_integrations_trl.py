"""TRL's GRPOTrainer trains on a served agilerl env through ``agilerl.integrations.trl``."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("trl")

from agilerl.integrations.trl import EnvRollout, env_reward, task_prompt  # noqa: E402
from agilerl.remote.hosting import resolve_env  # noqa: E402


def _trainer(rollout, model, tokenizer, tmp_path, **config):
    from trl import GRPOConfig, GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_steps=2,
        max_completion_length=4, learning_rate=1e-2, logging_steps=1, report_to=[], save_strategy="no",
        use_cpu=True, seed=0, gradient_checkpointing=False, **config,
    )
    return GRPOTrainer(
        model=model, processing_class=tokenizer, args=args, train_dataset=rollout.dataset(8),
        reward_funcs=env_reward, rollout_func=rollout,
    )


def test_two_grpo_steps_train_on_the_served_envs_rewards_with_env_tokens_masked(tmp_path, chatml_tokenizer):
    import torch

    from agilerl.train.tiny_model import build_tiny_model

    model = build_tiny_model(chatml_tokenizer)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    url, server = resolve_env("guess", max_concurrent_envs=8)
    calls = []

    class Recorded(EnvRollout):
        def __call__(self, prompts, trainer):
            out = super().__call__(prompts, trainer)
            calls.append((list(prompts), out, [t.num_turns for t in self.last_batch]))
            return out

    with server, Recorded(url, max_turns=2) as rollout:
        trainer = _trainer(rollout, model, chatml_tokenizer, tmp_path)
        trainer.train()
        assert server.active_sessions == 4  # one served session per prompt, reused across steps
    assert len(calls) == 2
    logged = [row for row in trainer.state.log_history if "rewards/env_reward/mean" in row]
    for (prompts, out, turns), row in zip(calls, logged):
        assert prompts[0] == prompts[1] and prompts[2] == prompts[3]  # GRPO groups of 2
        assert all(r is not None for r in out["env_reward"])
        assert row["rewards/env_reward/mean"] == pytest.approx(sum(out["env_reward"]) / 4, abs=1e-6)
        for ids, mask, logprobs, n in zip(out["completion_ids"], out["env_mask"], out["logprobs"], turns):
            assert len(ids) == len(mask) == len(logprobs) and n >= 1
            env_text = chatml_tokenizer.decode([t for t, m in zip(ids, mask) if not m])
            assert env_text.count("<|im_start|>user") == n  # the env's replies, not the model's
    assert any(len(set(out["env_reward"])) > 1 for _, out, _ in calls)  # a learning signal was there
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())


def test_a_prompt_names_its_task(chatml_tokenizer):
    import zlib
    from types import SimpleNamespace

    from agilerl.generation.policy import ScriptedPolicy

    args = SimpleNamespace(temperature=1.0, top_p=1.0, top_k=0, max_completion_length=4, seed=0)
    trainer = SimpleNamespace(args=args, processing_class=chatml_tokenizer)  # what the rollout reads
    own = "my own prompt"
    with EnvRollout("guess", policy=ScriptedPolicy(chatml_tokenizer)) as rollout:
        rollout([task_prompt(17), own, [{"role": "user", "content": own}]], trainer)
        assert [t.seed for t in rollout.last_batch] == [17, zlib.crc32(own.encode()), zlib.crc32(own.encode())]
        assert rollout.dataset(3)["prompt"] == ["agilerl task 0", "agilerl task 1", "agilerl task 2"]


ROWS_ENV = '''
class Rows:
    dataset_size = 3
    max_turns = 1

    def __init__(self, log):
        with open(log, "a") as f:
            f.write("built\\n")

    def reset(self, seed=None, *, row_index=None, evaluation=None):
        return f"row {row_index}", {}

    def step(self, action):
        return "done", 1.0, True, False, {}
'''


def test_the_env_dataset_reads_its_size_off_is_the_first_slots(tmp_path, chatml_tokenizer):
    from types import SimpleNamespace

    from agilerl.generation.policy import ScriptedPolicy

    (tmp_path / "rows.py").write_text(ROWS_ENV)
    log = tmp_path / "built.log"
    args = SimpleNamespace(temperature=1.0, top_p=1.0, top_k=0, max_completion_length=4, seed=0)
    trainer = SimpleNamespace(args=args, processing_class=chatml_tokenizer)
    with EnvRollout("rows.py:Rows", env_config={"log": str(log)}, base_dir=tmp_path,
                    policy=ScriptedPolicy(chatml_tokenizer)) as rollout:
        assert len(rollout.dataset()) == 3  # every row, read off one env
        assert log.read_text().count("built") == 1
        rollout([task_prompt(0), task_prompt(1)], trainer)
        assert [t.rewards for t in rollout.last_batch] == [[1.0], [1.0]]
        assert log.read_text().count("built") == 2  # two slots: the dataset's env and one more


def test_tool_calls_run_through_the_same_parser_in_trl_rollouts(tmp_path):
    """``tool_parser`` in an EnvRollout: the scripted model's call runs as the env's call_tool, the
    completion TRL gets is the generated call (trained) then the tool result (masked)."""
    from types import SimpleNamespace

    from agilerl.generation.policy import ScriptedPolicy
    from tests.test_tools_endpoint import ENV
    from tests.tool_families import family_tokenizer

    tokenizer = family_tokenizer("hermes")
    (tmp_path / "calc.py").write_text(ENV)
    args = SimpleNamespace(temperature=1.0, top_p=1.0, top_k=0, max_completion_length=48, seed=0)
    trainer = SimpleNamespace(args=args, processing_class=tokenizer)
    call = '<tool_call>{"name": "submit", "arguments": {"answer": 5}}</tool_call>'
    with EnvRollout(str(tmp_path / "calc.py") + ":CalcEnv", tool_parser="hermes", policy=ScriptedPolicy(tokenizer, call)) as rollout:
        out = rollout([task_prompt(0)], trainer)
    assert out["env_reward"] == [1.0]
    completion, mask = out["completion_ids"][0], out["env_mask"][0]
    generated = [t for t, m in zip(completion, mask) if m]
    assert tokenizer.decode(generated) == call + "<|im_end|>"
    assert "<tool_response>\ndone\n</tool_response>" in tokenizer.decode([t for t, m in zip(completion, mask) if not m])
