"""Algorithms end to end on the real tiny model: configs from manifests, plugins, loss + backward,
and a few optimiser steps that move the policy the right way."""

from __future__ import annotations

import copy
import re
import sys
import types
from pathlib import Path

import pytest
import torch

from agilerl import hookimpl
from agilerl.builtins.registrations import ALGORITHMS
from agilerl.errors import ConfigError
from agilerl.train.algorithm import Algorithm, build_algorithm
from agilerl.train.compatibility import EnvSource, check_compatible
from agilerl.train.batch import collate_trajectories
from agilerl.train.logprobs import policy_logprobs
from agilerl.rollout.trajectory import Trajectory
from agilerl.errors import AgileRLError

ROLLOUT = ["grpo", "cispo", "gspo", "llmppo", "llmreinforce"]


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def chat_prompt(tokenizer, question: str = "Guess a number between 1 and 10.") -> list[int]:
    messages = [{"role": "user", "content": question}]
    return encode(
        tokenizer,
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
    )


def guess_game(
    tokenizer, guesses: list[str], rewards: list[float], group: int = 0, error=None
) -> Trajectory:
    """A hand-built multi-turn rollout: prompt, then (guess, env reply) per turn."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    traj = Trajectory(group=group, rewards=list(rewards), error=error)
    prompt = chat_prompt(tokenizer)
    traj.token_ids += prompt
    traj.action_mask += [False] * len(prompt)
    traj.turn_ids += [-1] * len(prompt)
    for turn, guess in enumerate(guesses):
        completion = encode(tokenizer, guess) + [end]
        reply = encode(tokenizer, "\n<|im_start|>user\nToo low!<|im_end|>\n<|im_start|>assistant\n")
        traj.token_ids += completion + reply
        traj.action_mask += [True] * len(completion) + [False] * len(reply)
        traj.turn_ids += [turn] * (len(completion) + len(reply))
    return traj


def game_batch(tokenizer):
    trajs = [
        guess_game(tokenizer, ["3", "7"], [0.0, 1.0]),
        guess_game(tokenizer, ["5", "9", "8"], [0.2, 0.0, 0.0]),
        guess_game(tokenizer, ["1"], [0.0], error="env timed out"),
        guess_game(tokenizer, ["7"], [1.0], group=1),
        guess_game(tokenizer, ["2"], [0.0], group=1),
    ]
    return collate_trajectories(trajs, pad_id=tokenizer.pad_token_id)


@pytest.mark.parametrize("name", ROLLOUT)
@pytest.mark.parametrize("granularity", ["auto", "turn"])
def test_rollout_loss_backpropagates_through_the_tiny_model(
    name, granularity, tiny_model, chatml_tokenizer
):
    model = copy.deepcopy(tiny_model)
    algorithm = build_algorithm({"name": name, "beta": 0.05, "advantage_granularity": granularity})
    policy = algorithm.prepare_policy(model)
    batch = game_batch(chatml_tokenizer)
    with torch.no_grad():  # sampling-time log-probs, as a collector reports them
        batch.old_logprobs = (
            policy_logprobs(model, batch.input_ids, batch.attention_mask) * batch.action_mask
        )
    loss, metrics = algorithm.loss(policy, batch, reference=copy.deepcopy(model).eval())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(isinstance(v, float) for v in metrics.values())
    assert metrics["valid_fraction"] == pytest.approx(0.8) and metrics["kl"] == pytest.approx(
        0.0, abs=1e-6
    )
    assert metrics["turn_level"] == 1.0
    grads = [p.grad for p in policy.parameters() if p.grad is not None]
    assert grads and sum(g.abs().sum() for g in grads) > 0


@pytest.mark.parametrize("name", ROLLOUT)
def test_rewarded_token_becomes_more_likely(name, tiny_model, chatml_tokenizer):
    """Four answers to one prompt, only '7' rewarded: three steps raise p('7' | prompt)."""
    model = copy.deepcopy(tiny_model)
    algorithm = build_algorithm({"name": name})
    policy = algorithm.prepare_policy(model)
    prompt = chat_prompt(chatml_tokenizer)
    answers = [encode(chatml_tokenizer, digit)[0] for digit in "7352"]
    trajs = [
        Trajectory(
            token_ids=prompt + [token],
            action_mask=[False] * len(prompt) + [True],
            turn_ids=[-1] * len(prompt) + [0],
            rewards=[float(token == answers[0])],
        )
        for token in answers
    ]
    batch = collate_trajectories(trajs, pad_id=chatml_tokenizer.pad_token_id)
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)

    def p_rewarded() -> float:
        with torch.no_grad():
            return (
                policy_logprobs(model, batch.input_ids[:1], batch.attention_mask[:1])[0, -1]
                .exp()
                .item()
            )

    before = p_rewarded()
    for _ in range(3):
        optimizer.zero_grad()
        loss, _ = algorithm.loss(policy, batch)
        loss.backward()
        optimizer.step()
    assert p_rewarded() > before * 1.5


def test_ppo_wraps_the_model_with_a_value_head(tiny_model):
    policy = build_algorithm({"name": "llmppo"}).prepare_policy(tiny_model)
    assert policy.model is tiny_model
    out = policy(
        input_ids=torch.tensor([[1, 2, 3]]), attention_mask=torch.ones(1, 3, dtype=torch.long)
    )
    assert out.values.shape == (1, 3) and out.logits.shape[:2] == (1, 3)


def dataset_env(tokenizer, objective: str):
    from datasets import Dataset

    from agilerl.data.dataset_env import DatasetEnv

    rows = {
        "prompt": [f"What is {i} + 1?" for i in range(4)],
        "response": [str(i + 1) for i in range(4)],
    }
    if objective == "preference":
        rows = {"prompt": rows["prompt"], "chosen": rows["response"], "rejected": ["no"] * 4}
    return DatasetEnv(
        Dataset.from_dict(rows), tokenizer, objective, train_test_split=0.5, batch_size=4
    )


@pytest.mark.parametrize(
    ("name", "objective", "metric", "improves"),
    [
        ("sft", "sft", "loss", -1),
        ("dpo", "preference", "reward_margin", 1),
    ],
)
def test_dataset_algorithms_learn_from_dataset_env_batches(
    name, objective, metric, improves, tiny_model, chatml_tokenizer
):
    model = copy.deepcopy(tiny_model)
    algorithm = build_algorithm({"name": name})
    check_compatible(algorithm, EnvSource("dataset", objective))
    reference = copy.deepcopy(model).eval() if algorithm.needs_reference else None
    batch = next(dataset_env(chatml_tokenizer, objective).batches())
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    values = []
    for _ in range(4):
        optimizer.zero_grad()
        loss, metrics = algorithm.loss(model, batch, reference)
        loss.backward()
        optimizer.step()
        values.append(metrics[metric])
    assert (values[-1] - values[0]) * improves > 0


def test_every_builtin_is_registered_and_an_algorithm():
    from agilerl.registry import resolve

    names = {name for name, _, _ in ALGORITHMS}
    assert names == {"grpo", "cispo", "gspo", "llmppo", "llmreinforce", "sft", "dpo"}
    for name in names:
        assert issubclass(resolve("algorithm", name), Algorithm)


def error_of(section) -> str:
    with pytest.raises(ConfigError) as info:
        build_algorithm(section)
    return str(info.value)


def test_token_granularity_is_refused_for_group_relative_algorithms():
    message = error_of({"name": "gspo", "advantage_granularity": "token"})
    assert "algorithm.advantage_granularity" in message and "llmppo or llmreinforce" in message
    assert (
        build_algorithm(
            {"name": "llmppo", "advantage_granularity": "token"}
        ).config.advantage_granularity
        == "token"
    )


def test_action_granularity_is_an_alias():
    assert (
        build_algorithm({"name": "grpo", "action_granularity": "turn"}).config.advantage_granularity
        == "turn"
    )


def test_config_errors_name_the_key_the_value_and_the_choices():
    assert "algorithm.epsilonn: Extra inputs are not permitted" in error_of(
        {"name": "grpo", "epsilonn": 0.1}
    )
    assert "epsilon_high" in error_of({"name": "grpo", "epsilonn": 0.1})  # lists the real keys
    assert "algorithm.beta" in error_of({"name": "dpo", "beta": 0}) and "(got 0)" in error_of(
        {"name": "dpo", "beta": 0}
    )
    assert "algorithm.name" in error_of({"beta": 0.1})
    assert "not a subclass" in error_of({"name": "collections:OrderedDict"})
    with pytest.raises(AgileRLError, match="grpoo"):
        build_algorithm({"name": "grpoo"})


def compatibility_error(name: str, source: EnvSource, sampling=None) -> str:
    with pytest.raises(ConfigError) as info:
        check_compatible(build_algorithm({"name": name}), source, sampling)
    return info.value.errors[0]


def test_check_compatible_names_the_field_and_the_fix_of_each_mismatch():
    from agilerl.generation.policy import SamplingParams

    rollout, sft = EnvSource("rollout"), EnvSource("dataset", "sft")
    check_compatible(build_algorithm({"name": "grpo"}), rollout, SamplingParams())
    check_compatible(build_algorithm({"name": "dpo"}), EnvSource("dataset", "preference"))
    assert compatibility_error("sft", rollout).startswith(
        "environment.env_type: algorithm SFT trains on dataset batches, not rollout; use SFT/DPO data"
    )
    assert compatibility_error("grpo", sft).startswith(
        "environment.env_type: algorithm GRPO trains on rollout batches, not dataset; use an env"
    )
    assert compatibility_error("dpo", sft).startswith(
        "environment.objective: algorithm DPO trains on 'preference' batches but the objective is 'sft'"
    )
    hot = compatibility_error("grpo", rollout, SamplingParams(temperature=0.7))
    assert hot.startswith("sampling.temperature: the collector samples at temperature 0.7 but GRPO")
    assert "SamplingParams(temperature=1.0" in hot


def test_the_sampling_temperature_is_declared_by_the_algorithm():
    from agilerl.generation.policy import SamplingParams

    assert build_algorithm({"name": "grpo", "temperature": 0.7}).sampling_temperature == 0.7
    assert build_algorithm({"name": "sft"}).sampling_temperature is None

    class AnyTemperature(Algorithm):  # the base declares no temperature: any sampling fits
        def loss(self, policy, batch, reference=None):
            raise NotImplementedError

    check_compatible(AnyTemperature(), EnvSource("rollout"), SamplingParams(temperature=0.3))


def test_a_third_party_algorithm_plugs_in_by_name():
    from agilerl.builtins.algorithms.reinforce import LLMREINFORCE
    from agilerl.registry import get_plugin_manager

    class Scaled(LLMREINFORCE):
        """A third party's variant, registered under its own name."""

    plugin = types.ModuleType("toy_algorithm_plugin")
    plugin.Scaled = Scaled

    @hookimpl
    def register_algorithms(register):
        register("toy-reinforce", Scaled, description="test plugin")

    plugin.register_algorithms = register_algorithms
    manager = get_plugin_manager()
    manager.register(plugin)
    sys.modules["toy_algorithm_plugin"] = plugin
    try:
        algorithm = build_algorithm({"name": "toy-reinforce", "gamma": 0.9})
        assert isinstance(algorithm, Scaled) and algorithm.config.gamma == 0.9
    finally:
        manager.unregister(plugin)
        del sys.modules["toy_algorithm_plugin"]


DOCS = Path(__file__).resolve().parents[1] / "docs" / "algorithms.md"


def test_docs_list_every_option_with_its_default():
    from agilerl.registry import resolve

    text = DOCS.read_text()
    for name, _, _ in ALGORITHMS:
        section = text.split(f"### `{name}`\n", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
        fields = resolve("algorithm", name).config_class.model_fields
        for key, field in fields.items():
            assert f"| `{key}` | `{field.default!r}` |" in section, (name, key)
        documented = re.findall(r"^\| `(\w+)` \|", section, flags=re.MULTILINE)
        assert set(documented) == set(fields), name


def test_docs_example_runs(capsys):
    from agilerl.registry import get_plugin_manager

    code = "\n".join(re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.DOTALL))
    namespace: dict = {}
    manager = get_plugin_manager()
    try:
        exec(compile(code, str(DOCS), "exec"), namespace)
    finally:
        for plugin in manager.get_plugins():
            if isinstance(plugin, namespace.get("MyPlugin", ())):
                manager.unregister(plugin)
    assert "'loss':" in capsys.readouterr().out
