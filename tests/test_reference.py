"""The frozen reference of KL penalties and DPO: a copy, or with LoRA the adapters switched off."""

from __future__ import annotations

import torch

from agilerl.manifest.settings import LoraSettings, ModelSettings
from agilerl.train.logprobs import policy_logprobs
from agilerl.assembly.models import load_model_and_tokenizer
from agilerl.train.reference import frozen_reference


def _logprobs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return policy_logprobs(model, ids, torch.ones_like(ids))


def _train_a_little(model: torch.nn.Module, ids: torch.Tensor) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.5)
    for _ in range(3):
        optimizer.zero_grad()
        (-policy_logprobs(model, ids, torch.ones_like(ids)).sum()).backward()
        optimizer.step()


def test_with_lora_the_reference_is_the_base_model_without_a_copy() -> None:
    base, _ = load_model_and_tokenizer(ModelSettings(name_or_path="tiny"), seed=3)
    ids = torch.randint(5, base.config.vocab_size, (2, 12))
    before = _logprobs(base, ids)
    model, _ = load_model_and_tokenizer(ModelSettings(name_or_path="tiny", lora=LoraSettings(r=4)), seed=3)
    reference = frozen_reference(model)
    assert list(reference.parameters()) == []  # it holds no weights of its own
    model.train()
    _train_a_little(model, ids)
    assert not torch.allclose(_logprobs(model, ids), before, atol=1e-4)  # the adapters learned
    assert torch.allclose(_logprobs(reference, ids), before, atol=1e-5)  # the reference did not move
    assert model.training  # the reference call put the policy back in training mode
    assert any(p.requires_grad for p in model.parameters())


def test_without_lora_the_reference_is_a_frozen_copy() -> None:
    model, _ = load_model_and_tokenizer(ModelSettings(name_or_path="tiny"), seed=3)
    ids = torch.randint(5, model.config.vocab_size, (2, 12))
    reference = frozen_reference(model)
    before = _logprobs(reference, ids)
    model.train()
    _train_a_little(model, ids)
    assert torch.allclose(_logprobs(reference, ids), before)
    assert not any(p.requires_grad for p in reference.parameters())
