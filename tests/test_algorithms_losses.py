"""Each loss against hand-computed values, on a bigram 'model' whose log-probs are known exactly."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from agilerl.builtins.algorithms.cispo import CISPO
from agilerl.builtins.algorithms.dpo import DPO, dpo_loss
from agilerl.builtins.algorithms.grpo import GRPO
from agilerl.builtins.algorithms.gspo import GSPO
from agilerl.builtins.algorithms.sft import SFT
from agilerl.train.batch import collate_trajectories
from agilerl.train.logprobs import token_logprobs
from agilerl.rollout.trajectory import Trajectory

LOG4 = math.log(4)
A = 0.5 / (0.5 + 1e-4)  # the group-normalised advantage of rewards (1, 0)


class BigramLM(torch.nn.Module):
    """Next-token logits depend only on the current token: ``logits = table[input_ids]``."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(table.clone())

    def forward(self, input_ids, attention_mask=None):
        return SimpleNamespace(logits=self.table[input_ids])


def uniform(vocab: int = 4) -> BigramLM:
    return BigramLM(torch.zeros(vocab, vocab))


def rows_of(probabilities: list[float], vocab: int = 4) -> BigramLM:
    """Every row predicts ``probabilities`` for the next token."""
    return BigramLM(torch.tensor(probabilities).log().expand(vocab, vocab))


def pair(old_ratios: tuple[float, float] | None = None):
    """Two completions of one prompt (rewards 1 and 0); ``old_ratios``: pi/old at action token 1."""
    trajs = []
    for reward, ratio in zip((1.0, 0.0), old_ratios or (None, None), strict=True):
        logprobs = None if ratio is None else [0.0, -LOG4 - math.log(ratio), -LOG4]
        trajs.append(
            Trajectory(
                token_ids=[0, 1, 2],
                action_mask=[False, True, True],
                turn_ids=[-1, 0, 0],
                rewards=[reward],
                logprobs=logprobs,
            )
        )
    return collate_trajectories(trajs, pad_id=0)


def test_token_logprobs_align_with_the_scored_tokens():
    logits = torch.tensor([[[0.0, math.log(3)], [math.log(3), 0.0], [0.0, 0.0]]])
    out = token_logprobs(logits, torch.tensor([[0, 1, 1]]))
    assert out[0].tolist() == pytest.approx([0.0, math.log(0.75), math.log(0.25)])
    hot = token_logprobs(logits, torch.tensor([[0, 1, 1]]), temperature=0.5)
    assert hot[0, 1].item() == pytest.approx(math.log(0.9))


def test_grpo_on_policy_loss_is_minus_the_mean_advantage():
    loss, metrics = GRPO().loss(uniform(), pair())
    assert loss.item() == pytest.approx(0.0, abs=1e-6)  # (A + A - A - A) / 4
    assert metrics["clip_fraction"] == 0.0 and metrics["reward_mean"] == 0.5


def test_grpo_clips_the_ratio_on_the_pessimistic_side():
    logprobs = torch.full((2, 2), -LOG4)
    old = logprobs - torch.tensor([[math.log(1.5), 0.0], [math.log(0.5), 0.0]])
    advantages = torch.tensor([[A, A], [-A, -A]])
    objective, grad, metrics = surrogate_gradient(
        GRPO(), logprobs, old, advantages, torch.ones(2, 2, dtype=torch.bool)
    )
    # row 0 (A > 0): ratio 1.5 -> 1.2; row 1 (A < 0): ratio 0.5 -> 0.8; other tokens ratio 1
    assert objective.flatten().tolist() == pytest.approx([1.2 * A, A, -0.8 * A, -A], rel=1e-5)
    assert grad[:, 0].tolist() == [0.0, 0.0]  # the clipped side won: no gradient
    assert metrics["clip_fraction"] == 0.5


def test_kl_penalty_is_the_k3_estimate_against_the_reference():
    reference = rows_of([0.4, 0.2, 0.2, 0.2])  # the action tokens 1, 2 get 0.2; the policy 0.25
    grpo = GRPO.from_mapping({"beta": 0.5})
    assert grpo.needs_reference and not GRPO().needs_reference
    loss, metrics = grpo.loss(uniform(), pair(), reference)
    k3 = 0.8 - math.log(0.8) - 1
    assert metrics["kl"] == pytest.approx(k3, rel=1e-5)
    assert loss.item() == pytest.approx(0.5 * k3, rel=1e-4)
    with pytest.raises(ValueError, match="needs the reference model"):
        grpo.loss(uniform(), pair())


def surrogate_gradient(algorithm, logprobs, old, advantages, mask):
    logprobs = logprobs.clone().requires_grad_(True)
    objective, metrics = algorithm.surrogate(logprobs, old, advantages, mask)
    algorithm.aggregate(objective, mask).backward()
    return objective.detach(), logprobs.grad, metrics


def test_cispo_weights_the_log_prob_gradient_by_the_clipped_stopped_ratio():
    logprobs = torch.full((1, 3), -1.0)
    old = logprobs - torch.tensor([[0.0, math.log(1.5), math.log(0.5)]])  # ratios 1, 1.5, 0.5
    advantages = torch.tensor([[2.0, 2.0, -2.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    objective, grad, metrics = surrogate_gradient(CISPO(), logprobs, old, advantages, mask)
    weights = [1.0, 1.28, 0.5]  # upper bound 1 + 0.28; no lower bound by default
    assert grad[0].tolist() == pytest.approx(
        [w * a / 3 for w, a in zip(weights, [2, 2, -2], strict=True)]
    )
    assert objective[0].tolist() == pytest.approx([-2.0, -2.56, 1.0])  # weight * A * log-prob
    assert metrics["clip_fraction"] == pytest.approx(1 / 3)


def test_gspo_uses_one_length_normalised_ratio_per_sequence():
    logprobs = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    old = logprobs - torch.tensor([[3e-4, 0.0, 0.0], [0.0, 0.0, 0.0]])
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-1.0, 0.0, 0.0]])
    objective, grad, _ = surrogate_gradient(GSPO(), logprobs, old, advantages, mask)
    ratio = math.exp(1e-4)  # exp(mean log-ratio) of sequence 0, inside the (3e-4, 4e-4) clip
    assert objective[0].tolist() == pytest.approx([ratio] * 3)
    # each sequence weighs 1/2, spread over its own tokens
    assert grad.flatten().tolist() == pytest.approx([ratio / 6] * 3 + [-0.5, 0.0, 0.0])


def test_gspo_clips_a_whole_sequence():
    logprobs = torch.zeros(1, 2)
    old = torch.tensor([[-0.01, -0.01]])  # sequence ratio e^0.01 > 1 + 4e-4
    objective, grad, metrics = surrogate_gradient(
        GSPO(), logprobs, old, torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool)
    )
    assert objective[0].tolist() == pytest.approx([1.0004, 1.0004])
    assert grad.abs().sum() == 0 and metrics["clip_fraction"] == 1.0


def test_sft_averages_the_response_tokens_only():
    policy = rows_of([0.1, 0.2, 0.3, 0.4])
    batch = {
        "input_ids": torch.tensor([[0, 1, 2, 3], [0, 3, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]),
        "loss_mask": torch.tensor([[False, False, True, True], [False, True, False, False]]),
    }
    loss, metrics = SFT().loss(policy, batch)
    assert loss.item() == pytest.approx(-(math.log(0.3) + 2 * math.log(0.4)) / 3, rel=1e-5)
    assert metrics["perplexity"] == pytest.approx(math.exp(loss.item()), rel=1e-5)


def test_dpo_loss_from_summed_log_ratios():
    loss, metrics = dpo_loss(torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -2.0]), beta=0.5)
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-1.0))))
    assert metrics["reward_accuracy"] == 1.0 and metrics["reward_margin"] == pytest.approx(1.0)


def test_dpo_sums_each_response_under_its_own_mask():
    policy = rows_of([0.1, 0.2, 0.3, 0.4])
    batch = {
        "chosen_input_ids": torch.tensor([[0, 1]]),
        "chosen_attention_mask": torch.tensor([[1, 1]]),
        "chosen_loss_mask": torch.tensor([[False, True]]),
        "rejected_input_ids": torch.tensor([[0, 2, 2]]),
        "rejected_attention_mask": torch.tensor([[1, 1, 1]]),
        "rejected_loss_mask": torch.tensor([[False, True, True]]),
    }
    loss, metrics = DPO.from_mapping({"beta": 0.5}).loss(policy, batch, reference=uniform())
    margin = 0.5 * (math.log(0.2 / 0.25) - 2 * math.log(0.3 / 0.25))
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-margin))), rel=1e-5)
    assert metrics["reward_accuracy"] == 0.0
