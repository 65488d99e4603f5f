"""What tests/test_async_vllm.py asserts, computed in ``.venv-vllm``: GRPO in async mode on a
colocated vLLM engine (the tiny model), through the real collector, pipeline and trainer.

    .venv-vllm/bin/python tests/async_vllm_check.py REPORT.json STEPS
"""

from __future__ import annotations

import json
import os
import sys

from vllm_checks import MAX_MODEL_LEN, tiny


def main(report_path: str, steps: int) -> None:
    from agilerl.builtins.guess import GuessEnv
    from agilerl.manifest.settings import TrainingSettings
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.generation.policy import SamplingParams, TransformersPolicy
    from agilerl.generation.vllm.policy import VLLMPolicy
    from agilerl.train.loops import train_llm_rollout
    from agilerl.train.metrics import read_metrics

    model, tokenizer = tiny(seed=0)
    policy = VLLMPolicy(model, tokenizer, max_model_len=MAX_MODEL_LEN, seed=0)
    out = os.path.join(os.path.dirname(os.path.abspath(report_path)), "run")
    training = TrainingSettings(
        batch_size=4, group_size=4, max_steps=steps, lr=3e-3, max_new_tokens=3, evaluation_interval=0,
        seed=0, output_dir=out, rollout_mode="async", max_staleness=1,
    )

    def factory() -> GuessEnv:
        env = GuessEnv(low=1, high=10, target=7)
        env.system_prompt = "Reply with one number."
        return env

    with RolloutCollector(factory, tokenizer, batch_size=4, group_size=4, max_turns=3, seed=0,
                          sampling=SamplingParams(max_new_tokens=3)) as collector:
        train_llm_rollout(model, tokenizer, collector, "grpo", training, show_progress=False,
                          generation=policy, max_model_len=MAX_MODEL_LEN)
    rows = [r for r in read_metrics(os.path.join(out, "metrics.jsonl")) if "train/reward" in r]
    prompt = tokenizer.encode("<|im_start|>user\nReply with one number.<|im_end|>\n<|im_start|>assistant\n")
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    report = {
        "steps": [r["step"] for r in rows],
        "staleness_max": [r["rollout/staleness_max"] for r in rows],
        "weight_sync_s": [r.get("time/weight_sync_s") for r in rows],
        "engine_matches_trainer": policy.generate([prompt], greedy)[0].token_ids
        == TransformersPolicy(model, tokenizer, max_model_len=MAX_MODEL_LEN).generate([prompt], greedy)[0].token_ids,
    }
    with open(report_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":  # vLLM may spawn processes: start engines only here
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    main(sys.argv[1], int(sys.argv[2]))
