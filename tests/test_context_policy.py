"""``environment.context_policy``: a 20-turn episode in a context that holds a few turns.

``error`` ends it at the context (as before); ``truncate`` and ``restart`` rewrite the context
into a new training sample and play all 20 turns, every sample's tokens exactly those the policy
saw and generated; the env's ``restart_prompt(history)`` builds the fresh context when it has one.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from agilerl.errors import ConfigError, InvalidArgument
from agilerl.generation.policy import Generation, SamplingParams
from agilerl.manifest.spec import parse_env_spec, parse_manifest
from agilerl.rollout.collector import RolloutCollector
from agilerl.rollout.context_policy import Conversation, rewrite
from agilerl.train.batch import collate_trajectories

MAX_MODEL_LEN = 160
TURNS = 20


class LongEnv:
    """Twenty turns, 0.1 reward each; the observation names the turn."""

    max_turns = TURNS
    system_prompt = "Answer every question."

    def reset(self, seed=None, **kwargs):
        self.turn = 0
        return f"first prompt {seed % 100}", {}

    def step(self, action):
        self.turn += 1
        return f"obs {self.turn}", 0.1, self.turn >= TURNS, False, {}


class RestartingEnv(LongEnv):
    """Builds its own fresh context from the history it is handed."""

    def __init__(self):
        self.histories = []

    def restart_prompt(self, history):
        self.histories.append(history)
        return f"resume after {history[-1]['content']}"


class CountingPolicy:
    """Replies ``a<n>`` (n: the call's number, so no two completions are alike) and the stop
    token; keeps every prompt it was given with the completion it returned."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.calls = 0
        self.seen: list[tuple[list[int], list[int]]] = []

    def generate(self, prompts, params):
        out = []
        for prompt in prompts:
            self.calls += 1
            ids = self.tokenizer.encode(f"a{self.calls}", add_special_tokens=False) + [params.stop_token_ids[0]]
            self.seen.append((list(prompt), ids))
            out.append(Generation(ids, None, "stop"))
        return out


def play(tokenizer, policy_name, env=LongEnv, policy=None):
    policy = policy or CountingPolicy(tokenizer)
    with RolloutCollector(
        env, tokenizer, batch_size=2, group_size=1, seed=0, max_model_len=MAX_MODEL_LEN,
        sampling=SamplingParams(max_new_tokens=8), context_policy=policy_name,
    ) as collector:
        return collector.collect(policy), policy


def test_error_ends_the_episode_at_the_context_as_before(chatml_tokenizer):
    batch, _ = play(chatml_tokenizer, "error")
    for traj in batch.trajectories:
        assert traj.prior_samples == [] and traj.num_turns < TURNS
        assert traj.truncated and traj.info["truncated_by"] == "max_model_len"
    metrics = batch.stats.metrics()
    assert metrics["rollout/context_restarts"] == metrics["rollout/context_truncations"] == 0


@pytest.mark.parametrize("policy_name", ["truncate", "restart"])
def test_a_rewrite_starts_a_new_sample_and_the_episode_plays_on(chatml_tokenizer, policy_name):
    batch, policy = play(chatml_tokenizer, policy_name)
    rewrites = 0
    for traj in batch.trajectories:
        samples = traj.samples
        assert traj.num_turns == TURNS and traj.terminated and traj.error is None
        assert len(samples) > 2
        rewrites += len(samples) - 1
        for sample in traj.prior_samples:  # closed after its last generated token, within the context
            assert len(sample.token_ids) <= MAX_MODEL_LEN and sample.action_mask[-1]
        # every generated token is trained exactly once, as generated, its turn id the episode's
        actions = [t for s in samples for t, m in zip(s.token_ids, s.action_mask) if m]
        turn_ids = [k for s in samples for k, m in zip(s.turn_ids, s.action_mask) if m]
        generated = [g for prompt, g in policy.seen if _in(prompt, samples)]
        assert actions == [t for g in generated for t in g]
        assert sorted(set(turn_ids)) == list(range(TURNS)) and turn_ids == sorted(turn_ids)
    # each prompt the policy saw is exactly the start of a sample: nothing was re-tokenized
    for prompt, completion in policy.seen:
        assert any(_in(prompt, t.samples) for t in batch.trajectories)
    metric = {"restart": "rollout/context_restarts", "truncate": "rollout/context_truncations"}[policy_name]
    assert batch.stats.metrics()[metric] == rewrites
    opening = chatml_tokenizer.decode(batch.trajectories[0].samples[1].token_ids)
    assert "Answer every question." in opening and "first prompt" in opening
    if policy_name == "truncate":  # the oldest whole turns are gone, the newest kept as messages
        assert "obs 1<" not in opening and "<|im_start|>user\nobs" in opening
    else:
        assert "[earlier turns left out]" in opening
    tensors = collate_trajectories(batch.trajectories, pad_id=0)
    assert tensors.input_ids.shape[0] == sum(len(t.samples) for t in batch.trajectories)


def _in(prompt, samples) -> bool:
    """Whether ``prompt`` is the start of one of ``samples`` (what the policy was shown)."""
    return any(s.token_ids[: len(prompt)] == prompt for s in samples)


def test_restart_prompt_is_built_by_the_env_from_the_history(chatml_tokenizer):
    envs = []

    def factory():
        envs.append(RestartingEnv())
        return envs[-1]

    batch, _ = play(chatml_tokenizer, "restart", env=factory)
    env = next(e for e in envs if e.histories)
    history = env.histories[0]
    assert history[0] == {"role": "system", "content": "Answer every question."}
    assert history[1]["role"] == "user" and history[1]["content"].startswith("first prompt")
    assert [m["role"] for m in history[2:6]] == ["assistant", "user", "assistant", "user"]
    assert history[2]["content"].startswith("a") and history[3]["content"] == "obs 1"
    texts = [chatml_tokenizer.decode(s.token_ids) for t in batch.trajectories for s in t.samples[1:]]
    assert any(f"resume after {history[-1]['content']}" in text for text in texts)


def test_a_rewrite_that_cannot_fit_leaves_the_episode_to_end_as_under_error():
    conversation = Conversation([{"role": "user", "content": "x" * 50}])
    conversation.add_turn("a", "user", "o")
    render = lambda messages: list(range(sum(len(str(m["content"])) for m in messages)))  # noqa: E731
    assert rewrite("truncate", conversation, render, limit=40) is None
    assert rewrite("restart", conversation, render, limit=40, restart_prompt=lambda h: "y" * 60) is None
    assert rewrite("error", conversation, render, limit=400) is None
    assert len(rewrite("truncate", conversation, render, limit=400)) == 50  # the opening, no turn


def test_the_manifest_field_reaches_the_collector(chatml_tokenizer, tmp_path):
    env_file = tmp_path / "long_env.py"
    env_file.write_text(textwrap.dedent(
        """
        class LongEnv:
            max_turns = 20
            def reset(self, seed=None, **kwargs):
                self.turn = 0
                return "go", {}
            def step(self, action):
                self.turn += 1
                return f"obs {self.turn}", 0.1, self.turn >= 20, False, {}
        """
    ))
    spec = parse_env_spec({"env_type": "rollout", "entrypoint": "long_env.py:LongEnv", "context_policy": "truncate"})
    with RolloutCollector.from_spec(spec, chatml_tokenizer, batch_size=1, group_size=1, base_dir=tmp_path) as collector:
        assert collector.context_policy == "truncate"
        assert collector._envs[0].context_policy == "truncate"
    default = parse_env_spec({"env_type": "rollout", "entrypoint": "long_env.py:LongEnv"})
    assert default.context_policy == "error"
    with pytest.raises(ConfigError, match="context_policy"):
        parse_env_spec({"env_type": "rollout", "entrypoint": "long_env.py:LongEnv", "context_policy": "summarize"})
    with pytest.raises(InvalidArgument, match="context_policy must be one of error, truncate, restart"):
        RolloutCollector(LongEnv, chatml_tokenizer, batch_size=1, group_size=1, context_policy="drop")


@pytest.mark.parametrize("policy_name", ["restart", pytest.param("truncate", marks=pytest.mark.slow)])
def test_train_with_a_context_policy_on_the_tiny_model(tmp_path, policy_name):
    """``agilerl train``'s path: the manifest's policy and max_model_len; the recorded rollouts
    hold episodes of several samples, and the steps train on them."""
    from agilerl.assembly.from_manifest import train_from_manifest

    (tmp_path / "long_env.py").write_text(textwrap.dedent(
        """
        class LongEnv:
            max_turns = 20
            system_prompt = "Answer every question."
            def reset(self, seed=None, **kwargs):
                self.turn = 0
                return "first prompt", {}
            def step(self, action):
                self.turn += 1
                return f"obs {self.turn}", float(len(action) % 2), self.turn >= 20, False, {}
        """
    ))
    manifest = parse_manifest(
        {"environment": {"env_type": "rollout", "entrypoint": "long_env.py:LongEnv", "context_policy": policy_name},
         "model": {"name_or_path": "tiny", "max_model_len": MAX_MODEL_LEN},
         "algorithm": {"name": "grpo"},
         "training": {"batch_size": 1, "group_size": 2, "max_steps": 2, "max_new_tokens": 4, "seed": 0,
                      "evaluation_interval": 0, "record_rollouts": "all", "output_dir": str(tmp_path / "run")}},
        base_dir=tmp_path,
    )
    result = train_from_manifest(manifest, show_progress=False)
    assert result.step == 2
    key = {"restart": "rollout/context_restarts", "truncate": "rollout/context_truncations"}[policy_name]
    assert result.metrics[key] > 0
    records = [json.loads(line) for line in (result.output_dir / "rollouts.jsonl").read_text().splitlines()]
    split = [r for r in records if r["samples"] > 1]
    assert split and all(len(r["token_ids"]) <= MAX_MODEL_LEN for r in records if r["sample"] < r["samples"] - 1)
    episode = [r for r in records if r["episode"] == split[0]["episode"]]
    assert [r["sample"] for r in episode] == list(range(split[0]["samples"]))
    assert len(episode[0]["rewards"]) == 20


def test_an_episode_ended_at_the_context_keeps_its_samples_and_turns():
    """Cut at the context right after a rewrite (a fresh prompt never answered): that empty
    sample is dropped, the earlier ones and every turn's reward are kept."""
    from agilerl.rollout.assigner import Task
    from agilerl.rollout.results import Run, end_of_last_action
    from agilerl.rollout.trajectory import Trajectory

    traj = Trajectory(token_ids=[1, 2, 3, 4], action_mask=[False, True, False, True], turn_ids=[-1, 0, 0, 1],
                      rewards=[0.5, 1.0])
    traj.split()
    traj.token_ids, traj.action_mask, traj.turn_ids = [7, 8], [False, False], [-1, -1]
    run = Run({0: Task(0, None)}, group_size=1)
    run.finish(0, traj, cut_at=end_of_last_action(traj))
    kept = run.trajectories[0]
    assert kept.prior_samples == [] and kept.token_ids == [1, 2, 3, 4]
    assert kept.rewards == [0.5, 1.0] and kept.info["truncated_by"] == "max_model_len"
