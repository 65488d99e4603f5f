"""Two training processes under ``accelerate launch`` (CPU, gloo): each rank plays its own tasks
(or takes its own SFT batches), gradients are averaged, so both ranks end with identical
weights; rank 0 alone writes files."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

RANK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.rollout.policy import SamplingParams
    from agilerl.manifest.spec import load_manifest
    from agilerl.train.distributed import init_world
    from agilerl.train.loops import train_llm_rollout
    from agilerl.assembly.models import load_model_and_tokenizer

    manifest_path, sft_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    manifest = load_manifest(manifest_path)
    world = init_world()
    training = manifest.training.model_copy(update={
        "max_steps": 2, "batch_size": 2, "group_size": 2, "evaluation_interval": 0, "output_dir": out,
    })
    model, tokenizer = load_model_and_tokenizer(manifest.model, seed=training.seed)
    initial = [p.detach().clone() for p in model.parameters()]
    seeds = []
    with RolloutCollector.from_spec(
        manifest.environment, tokenizer, base_dir=manifest.base_dir, batch_size=2, group_size=2,
        seed=0, rank=world.rank, world_size=world.world_size,
        sampling=SamplingParams(max_new_tokens=training.max_new_tokens),
    ) as collector:
        collect = collector.collect
        def recording(policy):
            batch = collect(policy)
            seeds.extend(t.seed for t in batch.trajectories)
            return batch
        collector.collect = recording
        result = train_llm_rollout(model, tokenizer, collector, "grpo", training, show_progress=False)
    moved = sum(float((p.detach() - q).abs().sum()) for p, q in zip(model.parameters(), initial))
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    from agilerl.data.dataset_env import DatasetEnv
    from agilerl.train.loops import train_llm_dataset

    sft = load_manifest(sft_path)
    sft_model, _ = load_model_and_tokenizer(sft.model)
    dataset = DatasetEnv.from_spec(sft.environment, tokenizer, base_dir=sft.base_dir, batch_size=4)
    sft_training = sft.training.model_copy(update={
        "max_steps": 2, "evaluation_interval": 0, "output_dir": out + "/sft",
    })
    sft_result = train_llm_dataset(sft_model, tokenizer, dataset, "sft", sft_training, show_progress=False)
    sft_weights = torch.cat([p.detach().reshape(-1) for p in sft_model.parameters()])
    with open(f"{out}/rank{world.rank}.json", "w") as f:
        json.dump({"world_size": world.world_size, "step": result.step, "seeds": seeds,
                   "moved": moved, "weights": weights[:2000].tolist(),
                   "sft_step": sft_result.step, "sft_weights": sft_weights[:2000].tolist()}, f)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_cpu_ranks_average_gradients_and_shard_tasks(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    out = tmp_path / "run"
    out.mkdir()
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", str(_free_port())]
    result = subprocess.run(
        [*launcher, str(script), str(EXAMPLES / "guess" / "manifest.yaml"),
         str(EXAMPLES / "sft" / "manifest.yaml"), str(out)],
        check=False, capture_output=True, text=True, timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2] and [r["step"] for r in ranks] == [2, 2]
    assert ranks[0]["moved"] > 0
    assert ranks[0]["weights"] == ranks[1]["weights"]  # the same averaged update on both ranks
    assert not set(ranks[0]["seeds"]) & set(ranks[1]["seeds"])  # each rank its own tasks
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # one log, written by rank 0 only
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000002"]
    # SFT: each rank takes its own batches of every epoch, and the ranks still agree
    assert [r["sft_step"] for r in ranks] == [2, 2]
    assert ranks[0]["sft_weights"] == ranks[1]["sft_weights"]
