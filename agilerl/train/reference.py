"""The frozen reference model of KL penalties and DPO: the model as training found it."""

from __future__ import annotations

import copy
from typing import Any

import torch

__all__ = ["frozen_reference", "AdaptersOff"]


def frozen_reference(model: Any) -> torch.nn.Module:
    """Never updated. With LoRA it is the same weights with the adapters switched off: no second
    copy of the model in memory, and after a resume still the base model, not the adapters as
    they were when the run stopped. Otherwise a frozen deep copy."""
    if callable(getattr(model, "disable_adapter", None)):  # a peft model
        return AdaptersOff(model)
    reference = copy.deepcopy(model).eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    return reference


class AdaptersOff(torch.nn.Module):
    """Calls a peft model with its adapters disabled, in eval mode, without gradients."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self._model = [model]  # in a list: not a submodule, its weights are the policy's to train

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        model = self._model[0]
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), model.disable_adapter():
                return model(*args, **kwargs)
        finally:
            model.train(was_training)
