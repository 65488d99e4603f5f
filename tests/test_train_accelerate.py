"""accelerate's settings in one process: gradient accumulation and mixed precision."""

from __future__ import annotations

from pathlib import Path

import pytest

from agilerl.manifest.spec import load_manifest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _dpo(tmp_path: Path, **training: object) -> tuple[dict, list, list]:
    from agilerl.assembly.models import load_model_and_tokenizer
    from agilerl.data.dataset_env import DatasetEnv
    from agilerl.train.loops import train_llm_dataset
    from agilerl.train.metrics import read_metrics

    manifest = load_manifest(EXAMPLES / "dpo" / "manifest.yaml")
    settings = manifest.training.model_copy(
        update={"max_steps": 2, "evaluation_interval": 0, "output_dir": str(tmp_path), **training}
    )
    model, tokenizer = load_model_and_tokenizer(manifest.model)
    dataset = DatasetEnv.from_spec(
        manifest.environment, tokenizer, base_dir=manifest.base_dir, batch_size=settings.batch_size
    )
    result = train_llm_dataset(model, tokenizer, dataset, "dpo", settings, show_progress=False)
    return result.metrics, [p.detach().clone() for p in model.parameters()], read_metrics(tmp_path / "metrics.jsonl")


def test_two_accumulated_batches_make_the_step_of_one_twice_as_large(tmp_path):
    import torch

    whole, whole_weights, _ = _dpo(tmp_path / "whole", batch_size=4)
    accumulated, acc_weights, rows = _dpo(tmp_path / "acc", batch_size=2, gradient_accumulation_steps=2)
    assert [r["step"] for r in rows] == [1, 2]  # steps count optimiser steps, not batches
    # the same 4 rows per step (one shuffled epoch, cut in 2-row batches); DPO is a mean over rows
    assert accumulated["train/loss"] == pytest.approx(whole["train/loss"], rel=1e-5)
    assert accumulated["algo/grad_norm"] == pytest.approx(whole["algo/grad_norm"], rel=1e-4)
    assert all(torch.allclose(a, b, atol=1e-6, rtol=0) for a, b in zip(whole_weights, acc_weights))


def test_bf16_mixed_precision_trains_on_cpu_and_says_so(tmp_path):
    import torch

    metrics, weights, rows = _dpo(tmp_path, mixed_precision="bf16")
    assert rows[0]["engine"] == "accelerate single process, 1 process, bf16, cpu"
    assert all(w.dtype == torch.float32 for w in weights)  # autocast: the weights stay float32
    assert metrics["train/loss"] == pytest.approx(0.693, abs=0.01)  # log 2, as in float32
