"""Off-policy corrections: the truncated weight and the masks against hand-computed values, and
exact neutrality on-policy (sampler log-probs == the trainer's) on the real tiny model."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from agilerl.builtins.algorithms.grpo import GRPO
from agilerl.builtins.algorithms.off_policy import OffPolicyConfig, off_policy_correction
from agilerl.errors import ConfigError
from agilerl.rollout.trajectory import Trajectory
from agilerl.train.algorithm import build_algorithm
from agilerl.train.batch import collate_trajectories
from agilerl.train.logprobs import forward, token_logprobs
from tests.test_algorithms import game_batch

ROLLOUT = ["grpo", "cispo", "gspo", "llmppo", "llmreinforce"]
A = 0.5 / (0.5 + 1e-4)  # the group-normalised advantage of rewards (1, 0)


def correction(ratios: list[list[float]], mask: list[list[bool]] | None = None, **options):
    """The correction of tokens whose trainer/sampler ratios are ``ratios`` (trainer at 0)."""
    trainer = torch.zeros(len(ratios), len(ratios[0]))
    sampler = -torch.tensor(ratios).log()
    keep = torch.tensor(mask) if mask is not None else torch.ones_like(trainer, dtype=torch.bool)
    return off_policy_correction(trainer, sampler, keep, OffPolicyConfig(**options))


def test_the_weight_is_the_ratio_truncated_at_the_cap_without_gradient():
    out = correction([[0.5, 1.0, 1.5, 3.0]], importance_cap=2.0, token_mask_low=None, token_mask_high=None,
                     sequence_mask_low=None, sequence_mask_high=None)
    assert out.weight.tolist() == [pytest.approx([0.5, 1.0, 1.5, 2.0])]
    assert not out.weight.requires_grad
    assert out.mask.all()
    assert out.metrics["importance_truncated_fraction"] == 0.25
    assert out.metrics["importance_weight_mean"] == pytest.approx((0.5 + 1 + 1.5 + 2) / 4)
    ratio = torch.tensor([0.5, 1.0, 1.5, 3.0])
    assert out.metrics["sampler_kl"] == pytest.approx((ratio - ratio.log() - 1).mean().item())


def test_tokens_outside_the_token_bounds_leave_the_loss():
    out = correction([[0.1, 0.125, 1.0, 8.0, 9.0]], token_mask_low=0.125, token_mask_high=8.0,
                     sequence_mask_low=None, sequence_mask_high=None)
    assert out.mask.tolist() == [[False, True, True, True, False]]  # the bounds themselves stay
    assert out.metrics["token_masked_fraction"] == pytest.approx(0.4)


def test_a_rollout_outside_the_sequence_bounds_leaves_whole_on_its_geometric_mean():
    # row 0: geometric mean sqrt(4 * 16) = 8 > 5; row 1: sqrt(4 * 0.25) = 1 (its extremes cancel)
    out = correction([[4.0, 16.0], [4.0, 0.25]], token_mask_low=None, token_mask_high=None,
                     sequence_mask_low=0.2, sequence_mask_high=5.0)
    assert out.mask.tolist() == [[False, False], [True, True]]
    assert out.metrics["sequence_masked_fraction"] == 0.5


def test_sequence_level_weighs_every_token_of_a_rollout_by_its_capped_geometric_mean():
    # the geometric mean is over the masked (generated) tokens only: the third is the env's
    out = correction([[4.0, 0.25, 100.0], [2.0, 8.0, 1.0]], [[True, True, False], [True, True, False]],
                     importance_level="sequence", importance_cap=3.0, token_mask_low=None,
                     token_mask_high=None, sequence_mask_low=None, sequence_mask_high=None)
    assert out.weight.tolist() == [pytest.approx([1.0] * 3), pytest.approx([3.0] * 3)]  # 1; 4 -> 3
    assert out.metrics["importance_truncated_fraction"] == 0.5


def test_no_sampler_logprobs_means_no_correction():
    mask = torch.tensor([[False, True, True]])
    out = off_policy_correction(torch.zeros(1, 3), None, mask, OffPolicyConfig())
    assert out.mask is mask and out.weight is None and out.metrics == {}
    values = torch.ones(1, 3)
    assert out.weigh(values) is values


def test_the_options_are_checked_so_that_ratio_one_always_passes():
    for bad, message in [
        ({"importance_cap": 0.9}, "importance_cap"),
        ({"token_mask_low": 1.5}, "token_mask_low"),
        ({"token_mask_high": 0.5}, "token_mask_high"),
        ({"sequence_mask_low": -0.1}, "sequence_mask_low"),
        ({"sequence_mask_high": 0.9}, "sequence_mask_high"),
        ({"importance_level": "turn"}, "importance_level"),
        ({"token_mask_high": True}, "token_mask_high"),
    ]:
        with pytest.raises(ConfigError, match=message):
            build_algorithm({"name": "grpo", **bad})
    assert build_algorithm({"name": "grpo", "token_mask_low": None}).config.token_mask_low is None


def pair(sampler_ratios: tuple[float, float]):
    """Two completions of one prompt (rewards 1, 0) under a uniform 4-token model; the sampler
    saw the first generated token at ``pi_trainer / pi_sampler = ratio``."""
    log4 = math.log(4)
    trajs = [
        Trajectory(
            token_ids=[0, 1, 2], action_mask=[False, True, True], turn_ids=[-1, 0, 0], rewards=[reward],
            logprobs=[0.0, -log4 - math.log(ratio), -log4],
        )
        for reward, ratio in zip((1.0, 0.0), sampler_ratios, strict=True)
    ]
    return collate_trajectories(trajs, pad_id=0)


class Uniform(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.zeros(4, 4))

    def forward(self, input_ids, attention_mask=None):
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.table[input_ids])


def test_grpo_weighs_each_token_by_its_truncated_ratio_to_the_sampler():
    # token 1 of row 0 (A > 0) at ratio 1.5, of row 1 (A < 0) at 0.5; the clip (against the
    # trainer's own log-probs) bounds nothing: the correction alone acts
    loss, metrics = GRPO().loss(Uniform(), pair((1.5, 0.5)))
    assert loss.item() == pytest.approx(-(1.5 * A + A - 0.5 * A - A) / 4, rel=1e-5)
    assert metrics["clip_fraction"] == 0.0
    capped, _ = GRPO.from_mapping({"importance_cap": 1.2}).loss(Uniform(), pair((1.5, 0.5)))
    assert capped.item() == pytest.approx(-(1.2 * A + A - 0.5 * A - A) / 4, rel=1e-5)


def test_a_masked_token_leaves_the_mean_and_gets_no_gradient():
    model = Uniform()
    algorithm = GRPO.from_mapping({"token_mask_high": 1.4})
    loss, metrics = algorithm.loss(model, pair((1.5, 0.5)))
    assert loss.item() == pytest.approx(-(A - 0.5 * A - A) / 3, rel=1e-5)  # 3 tokens left
    assert metrics["token_masked_fraction"] == 0.25
    loss.backward()
    # token 1 is predicted from token 0 (the table's row 0) in both rollouts; only row 1's
    # (weight 0.5, advantage -A) is left: d(-(-0.5 A / 3) log p(1|0)) / d logits
    expected = 0.5 * A / 3 * (torch.tensor([0.0, 1.0, 0.0, 0.0]) - 0.25)
    assert model.table.grad[0].tolist() == pytest.approx(expected.tolist(), rel=1e-5)


def trainer_logprobs(algorithm, policy, batch) -> torch.Tensor:
    """What the loss computes for the trainer, by the same calls: the sampler's 'exact' log-probs."""
    with torch.no_grad():
        outputs = forward(policy, batch.input_ids, batch.attention_mask, batch.loss_mask)
        return token_logprobs(outputs.logits, batch.input_ids, temperature=algorithm.config.temperature)


def loss_and_grads(algorithm, policy, batch):
    policy.zero_grad(set_to_none=True)
    loss, metrics = algorithm.loss(policy, batch)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in policy.parameters() if p.grad is not None], metrics


@pytest.mark.parametrize("name", ROLLOUT)
def test_on_policy_the_loss_and_gradients_are_bit_for_bit_unchanged(name, tiny_model, chatml_tokenizer):
    """Sampler log-probs equal to the trainer's give exactly the loss and gradients of a batch
    without them (today's on-policy step), even with bounds pressed against 1 and no cap slack."""
    tight = {"importance_cap": 1.0, "token_mask_low": 1.0, "token_mask_high": 1.0,
             "sequence_mask_low": 1.0, "sequence_mask_high": 1.0}
    for options in ({}, tight, {**tight, "importance_level": "sequence"}):
        algorithm = build_algorithm({"name": name, "advantage_granularity": "turn", **options})
        policy = algorithm.prepare_policy(copy.deepcopy(tiny_model))
        without = game_batch(chatml_tokenizer)
        assert without.old_logprobs is None
        with_sampler = copy.copy(without)
        with_sampler.old_logprobs = trainer_logprobs(algorithm, policy, without) * without.action_mask
        loss0, grads0, metrics0 = loss_and_grads(algorithm, policy, without)
        loss1, grads1, metrics1 = loss_and_grads(algorithm, policy, with_sampler)
        assert torch.equal(loss0, loss1), (name, options)
        assert len(grads0) == len(grads1) > 0
        assert all(torch.equal(g0, g1) for g0, g1 in zip(grads0, grads1, strict=True)), (name, options)
        assert metrics1["sampler_kl"] == 0.0 and metrics1["importance_weight_mean"] == 1.0
        assert metrics1["token_masked_fraction"] == metrics1["sequence_masked_fraction"] == 0.0
        assert "sampler_kl" not in metrics0


def test_on_policy_grpo_is_the_clipped_surrogate_against_the_samplers_logprobs(tiny_model, chatml_tokenizer):
    """Before the correction, GRPO's ratio was taken against the sampler's log-probs; on-policy
    the new loss is that formula's, value and gradient."""
    from agilerl.train.logprobs import masked_mean

    algorithm = build_algorithm({"name": "grpo", "advantage_granularity": "turn"})
    policy = copy.deepcopy(tiny_model)
    batch = game_batch(chatml_tokenizer)
    batch.old_logprobs = trainer_logprobs(algorithm, policy, batch) * batch.action_mask
    loss, grads, _ = loss_and_grads(algorithm, policy, batch)

    policy.zero_grad(set_to_none=True)
    outputs = forward(policy, batch.input_ids, batch.attention_mask, batch.loss_mask)
    logprobs = token_logprobs(outputs.logits, batch.input_ids)
    advantages = algorithm.advantages(batch, "turn")
    ratio = torch.exp(logprobs - batch.old_logprobs)
    objective = torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
    before = -masked_mean(objective, batch.loss_mask)
    before.backward()
    assert torch.equal(loss, before.detach())
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, [p for p in policy.parameters() if p.grad is not None], strict=True))


@pytest.mark.parametrize("name", ROLLOUT)
def test_stale_samples_are_corrected_and_train(name, tiny_model, chatml_tokenizer):
    """Sampler log-probs from other weights (a step behind): a finite loss with gradients, the
    gap measured, and the weights actually different from 1."""
    algorithm = build_algorithm({"name": name, "advantage_granularity": "turn"})
    policy = algorithm.prepare_policy(copy.deepcopy(tiny_model))
    batch = game_batch(chatml_tokenizer)
    stale = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for parameter in stale.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    batch.old_logprobs = trainer_logprobs(algorithm, stale, batch) * batch.action_mask
    loss, grads, metrics = loss_and_grads(algorithm, policy, batch)
    assert torch.isfinite(loss) and sum(g.abs().sum() for g in grads) > 0
    assert metrics["sampler_kl"] > 0 and metrics["importance_weight_mean"] != 1.0
