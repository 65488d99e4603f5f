"""Two training processes on CPU (gloo) under ``accelerate launch``, DDP and FSDP2, running the
same manifests as one plain process, through the real ``agilerl train`` command.

Equivalence: DPO on the example preference data, 2 steps. One process takes batches of 4 rows;
two processes take 2 rows each of the same shuffled epoch (rank r takes batch r, r + 2, ...), so
every step sees the same 4 rows. DPO's loss is a mean over rows, so the mean of the two ranks'
losses (what DDP's gradient average and the logged loss are) is exactly the one process's loss
in real arithmetic. Tolerance: only float32 summation order differs (gloo's all-reduce and FSDP's
reduce-scatter add the two halves in another order; padding to each rank's own longest row), a
relative 1e-7 per operation: losses and gradient norms must agree to a relative 1e-5. Weights:
Adam's first steps move each weight by about lr * sign(gradient), so any gradient whose sign
differed would show as a difference of order lr (1e-5); the weights must agree to lr / 10.
Measured: losses equal to 1e-7, weights to 4e-8 (one float32 ulp at these magnitudes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agilerl.ports import free_port

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
LR = 1e-5

DPO = f"""
environment:
  env_type: dataset
  objective: preference
  dataset: {EXAMPLES / "dpo" / "data.jsonl"}
  columns: {{prompt: question}}
  prompt_template: {{user_0: "{{question}}"}}
  train_test_split: 0.8
model: {{name_or_path: tiny}}
algorithm: {{name: dpo, beta: 0.1}}
training: {{batch_size: BATCH, max_steps: 2, lr: {LR}, evaluation_interval: 2, seed: 0}}
"""

GRPO = """
environment:
  env_type: rollout
  entrypoint: guess
  env_config: {low: 1, high: 10, target: 7, system_prompt: Reply with one number.}
  max_turns: 3
model: MODEL
algorithm: {name: grpo, beta: 0.1}
training: {batch_size: 2, group_size: 2, max_steps: 4, max_new_tokens: 3, lr: 1.0e-2,
           evaluation_interval: 2, eval_episodes: 1, stop_at_eval_reward: -1.0, seed: 0}
"""


def _launch(engine: str, manifest: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return _accelerate_launch(
        engine, ["-m", "agilerl", "train", str(manifest), "--output-dir", str(out), "--no-progress", *extra]
    )


def _accelerate_launch(engine: str, program: list[str], *, ok: bool = True) -> subprocess.CompletedProcess[str]:
    flags = ["--multi_gpu"] if engine == "ddp" else ["--use_fsdp", "--fsdp_version", "2"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *flags, "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), *program]
    result = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert (result.returncode == 0) == ok, result.stderr[-4000:]
    return result


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _weights(checkpoint: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(checkpoint / "model.safetensors")


@pytest.fixture(scope="module")
def dpo_runs(tmp_path_factory):
    """The same DPO manifest: one plain process (batch 4), DDP and FSDP2 (2 x batch 2)."""
    from agilerl.cli.main import main

    root = tmp_path_factory.mktemp("dpo")
    (root / "one.yaml").write_text(DPO.replace("BATCH", "4"))
    (root / "two.yaml").write_text(DPO.replace("BATCH", "2"))
    assert main(["train", str(root / "one.yaml"), "--output-dir", str(root / "one"), "--no-progress"]) == 0
    launched = {e: _launch(e, root / "two.yaml", root / e) for e in ("ddp", "fsdp")}
    return root, launched


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_two_processes_match_one_with_the_same_global_batch(dpo_runs, engine):
    root, _ = dpo_runs
    one, two = _rows(root / "one"), _rows(root / engine)
    assert [r["step"] for r in two] == [0, 1, 2]  # one log, written by rank 0 only
    # rank 0 evaluates alone, on weights (policy and, under FSDP2, sharded reference) gathered whole
    for a, b in zip(one[::2], two[::2]):
        assert b["eval/loss"] == pytest.approx(a["eval/loss"], rel=1e-5)
    assert two[0]["engine"] == {"ddp": "accelerate DDP", "fsdp": "accelerate FSDP2"}[engine] + ", 2 processes, fp32, cpu"
    assert one[0]["engine"] == "accelerate single process, 1 process, fp32, cpu"
    one, two = one[1:], two[1:]
    for a, b in zip(one, two):
        assert b["train/loss"] == pytest.approx(a["train/loss"], rel=1e-5)
        assert b["algo/grad_norm"] == pytest.approx(a["algo/grad_norm"], rel=1e-5)
    # the saved model is whole (gathered from the shards under FSDP) and loads for inference
    base = _weights(root / "one" / "checkpoints" / "step-000002")
    other = _weights(root / engine / "checkpoints" / "step-000002")
    shared = base.keys() & other.keys()
    assert len(shared) >= len(base) - 1  # a tied lm_head may be stored once or twice
    assert max(float((base[k] - other[k]).abs().max()) for k in shared) < LR / 10
    from agilerl.assembly.models import load_model_and_tokenizer
    from agilerl.manifest.settings import ModelSettings

    initial = load_model_and_tokenizer(ModelSettings())[0].state_dict()
    assert max(float((base[k] - initial[k]).abs().max()) for k in base) > LR  # it did move


def test_an_fsdp_checkpoint_resumes(dpo_runs):
    root, _ = dpo_runs
    saved = root / "fsdp" / "checkpoints" / "step-000002"
    assert (saved / "accelerate" / "pytorch_model_fsdp_0").is_dir()  # sharded state, per rank
    assert (saved / "accelerate" / "optimizer_0").is_dir()
    result = _launch("fsdp", root / "two.yaml", root / "fsdp", "--resume", "--max-steps", "3")
    assert "finished at step 3" in result.stdout
    assert result.stderr.count("engine: accelerate FSDP2, 2 processes, fp32, cpu") == 1  # rank 0's
    assert result.stdout.count("finished at step") == 1  # rank 0 alone reports
    rows = _rows(root / "fsdp")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert rows[3]["train/loss"] != rows[2]["train/loss"]  # new rows, moved weights
    assert (root / "fsdp" / "checkpoints" / "step-000003" / "model.safetensors").is_file()


@pytest.mark.parametrize(("engine", "model"), [("ddp", "{name_or_path: tiny, lora: {r: 4}}"),
                                               ("fsdp", "{name_or_path: tiny}")])
def test_grpo_with_a_reference_trains_under_both_engines(tmp_path, engine, model):
    """GRPO with a KL reference (beta 0.1): LoRA under DDP (the reference is the adapters
    switched off), full weights under FSDP2 (generation on gathered weights; rank 0 evaluates
    alone, the other rank waits). Every reward reaches ``stop_at_eval_reward: -1``: rank 0's
    verdict at step 2's evaluation ends both ranks' runs there, of max_steps 4."""
    manifest = tmp_path / "m.yaml"
    manifest.write_text(GRPO.replace("MODEL", model))
    out = tmp_path / "run"
    _launch(engine, manifest, out)
    rows = _rows(out)
    assert [r["step"] for r in rows] == [0, 1, 2]  # the baseline evaluation, each step, the stop at 2
    assert rows[0]["engine"].startswith(f"accelerate {'DDP' if engine == 'ddp' else 'FSDP2'}, 2 processes")
    assert all("algo/kl" in r for r in rows[1:]), rows[1]
    assert "eval/reward" in rows[2]
    saved = out / "checkpoints" / "step-000002"
    if engine == "ddp":
        assert (saved / "adapter_model.safetensors").is_file()  # only the adapters, as peft saves
        assert not (saved / "model.safetensors").exists()
    else:
        assert (saved / "model.safetensors").is_file()


SHARDED_REFERENCE = """
import json
import sys
from pathlib import Path
from torch.distributed.tensor import DTensor
from agilerl.assembly.models import load_model_and_tokenizer
from agilerl.manifest.settings import ModelSettings, TrainingSettings
from agilerl.train.distributed import build_accelerator, prepare_reference
from agilerl.train.reference import frozen_reference

accelerator = build_accelerator(TrainingSettings())
reference = prepare_reference(accelerator, frozen_reference(load_model_and_tokenizer(ModelSettings())[0]))
params = list(reference.parameters())
report = {"sharded": all(isinstance(p, DTensor) for p in params), "trainable": any(p.requires_grad for p in params),
          "local": sum(p.to_local().numel() for p in params), "whole": sum(p.numel() for p in params),
          "eval": not reference.training}
Path(sys.argv[1], f"rank{accelerator.process_index}.json").write_text(json.dumps(report))  # a file each: prints interleave
"""


def test_under_fsdp2_the_reference_is_sharded_like_the_policy(tmp_path):
    """A model that only fits sharded must fit as its own reference too (TRL shards it as well)."""
    script = tmp_path / "reference.py"
    script.write_text(SHARDED_REFERENCE)
    _accelerate_launch("fsdp", [str(script), str(tmp_path)])
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for report in reports:
        assert report["sharded"] and report["eval"] and not report["trainable"]
        assert report["local"] <= report["whole"] * 0.55  # each rank holds about half


SLOW_RANK = """
import os, sys, time
import accelerate.accelerator as engine
from agilerl.cli.main import main

real = engine.save_accelerator_state


def late(*args, **kwargs):  # a busy host: rank 1 reaches its own files after rank 0 finished
    if os.environ.get("RANK") == "1":
        time.sleep(2)
    return real(*args, **kwargs)


engine.save_accelerator_state = late
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_slow_rank_writes_its_checkpoint_files_before_rank_0_moves_the_folder(tmp_path):
    """Rank 1 writes its share of a sharded checkpoint two seconds after rank 0 has written
    its own: rank 0 waits for it before renaming ``step-N.partial`` (it used to rename it from
    under rank 1: "Parent directory .../step-000001.partial/accelerate does not exist")."""
    script, manifest, out = tmp_path / "slow_rank.py", tmp_path / "m.yaml", tmp_path / "run"
    script.write_text(SLOW_RANK)
    manifest.write_text(DPO.replace("BATCH", "2").replace("max_steps: 2", "max_steps: 1")
                        .replace("evaluation_interval: 2", "evaluation_interval: 0"))
    _accelerate_launch("fsdp", [str(script), "train", str(manifest), "--output-dir", str(out), "--no-progress"])
    saved = out / "checkpoints" / "step-000001" / "accelerate"
    assert sorted(p.name for p in saved.glob("random_states_*.pkl")) == ["random_states_0.pkl", "random_states_1.pkl"]
    assert not list((out / "checkpoints").glob("*.partial"))


FAILS_ON_RANK_1 = '''
import os
from pathlib import Path


class FailsOnRank1:
    """Rank 1's envs work for eight episodes (two steps), then every reset raises; rank 0's never fail."""

    max_turns = 1

    def __init__(self, log):
        self.log = Path(f"{log}.{os.environ['RANK']}")

    def reset(self, seed=None):
        with self.log.open("a") as f:
            f.write("reset\\n")
        if os.environ["RANK"] == "1" and len(self.log.read_text().splitlines()) > 8:
            raise RuntimeError("the env's backing service is gone")
        return "Say hi.", {}

    def step(self, action):
        return "", 1.0, True, False, {}
'''


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_when_one_rank_fails_every_rank_saves_the_last_whole_step_together(tmp_path):
    """Rank 1's collection fails at step 3; rank 0's does not. Every rank stops at the same
    point, they save step 2 together and the run ends (no rank left waiting in a collective);
    the failing rank names its error and the checkpoint, the other says which rank failed. With
    several ranks nothing used to be saved on a failure."""
    import yaml

    (tmp_path / "env.py").write_text(FAILS_ON_RANK_1)
    manifest, out = tmp_path / "m.yaml", tmp_path / "run"
    manifest.write_text(yaml.safe_dump({
        "environment": {"env_type": "rollout", "entrypoint": "env.py:FailsOnRank1",
                        "env_config": {"log": str(tmp_path / "resets")}},
        "training": {"max_steps": 4, "batch_size": 2, "group_size": 2, "max_new_tokens": 2,
                     "evaluation_interval": 0, "checkpoint_minutes": None},
    }))
    result = _accelerate_launch("ddp", ["-m", "agilerl", "train", str(manifest), "--output-dir", str(out),
                                        "--no-progress"], ok=False)
    saved = out / "checkpoints" / "step-000002"
    assert "the env's backing service is gone" in result.stderr
    assert "rank 1 of 2 failed" in result.stderr  # rank 0's words
    assert f"the last whole step, 2, is saved in {saved}" in result.stderr
    assert f"resume with: agilerl train {manifest} --output-dir {out} --no-progress --resume" in result.stderr
    assert [r["step"] for r in _rows(out)] == [1, 2]
    assert (saved / "trainer_state.json").is_file()
    assert sorted(p.name for p in (saved / "accelerate").glob("random_states_*")) == ["random_states_0.pkl", "random_states_1.pkl"]


MERGE = """
import json, sys
from accelerate import Accelerator
from agilerl.train.distributed import merge_over_ranks
acc = Accelerator(cpu=True)
mine = [{"loss": 1.0, "rollout/lost": 2.0, "rollout/staleness_max": 3.0, "reward/a": 0.5},
        {"loss": 3.0, "rollout/lost": 1.0, "rollout/staleness_max": 1.0, "reward/b": 4.0}][acc.process_index]
merged = merge_over_ranks(acc, mine)
if acc.is_main_process:
    open(sys.argv[1], "w").write(json.dumps(merged))
acc.wait_for_everyone()
acc.end_training()  # leaves the process group: an open one can abort a rank at exit
"""


def test_metrics_merge_over_two_ranks_by_each_keys_reduction_even_where_the_keys_differ(tmp_path):
    """Means average the ranks that report a key, counts add, maxima take the largest; a key only
    one rank logged (a reward component) is that rank's value, not halved."""
    script, out = tmp_path / "merge.py", tmp_path / "merged.json"
    script.write_text(MERGE)
    _accelerate_launch("ddp", [str(script), str(out)])
    assert json.loads(out.read_text()) == {
        "loss": 2.0, "rollout/lost": 3.0, "rollout/staleness_max": 3.0, "reward/a": 0.5, "reward/b": 4.0,
    }


def test_only_the_vllm_weight_transfer_calls_torch_distributed_the_rest_goes_through_accelerate():
    """Collectives are the engine's (accelerate's ``gather``, ``gather_object``, ``reduce``): a
    hand-rolled ``torch.distributed`` call elsewhere would bypass its device and backend handling."""
    import re

    package = Path(__file__).resolve().parent.parent / "agilerl"
    calls = re.compile(r"\b(dist|torch\.distributed)\.(all_\w+|broadcast\w*|reduce\w*|gather\w*|scatter\w*|barrier|send|recv)\(")
    imports = re.compile(r"import torch\.distributed as|from torch\.distributed import (?!fsdp)")
    found = [
        f"{path.relative_to(package)}:{n}"
        for path in package.rglob("*.py")
        if "generation/vllm" not in path.as_posix()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if calls.search(line) or imports.search(line)
    ]
    assert found == []
