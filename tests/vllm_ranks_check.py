"""What tests/test_vllm.py and tests/test_vllm_server.py assert of vLLM under a launcher:

    accelerate launch --use_fsdp --fsdp_version 2 --num_processes 2 tests/vllm_ranks_check.py OUT_DIR [URL ...]

Without URLs (in ``.venv-vllm``) each rank builds its own engine (vLLM's ``external_launcher``);
with URLs every rank generates on those ``vllm serve`` replicas and the pushes go through a
folder. GRPO trains a few steps through ``train_llm_rollout``, then each rank compares every
engine (its own, or each replica) with the trained weights gathered whole: greedy tokens and
log-probs, against the trainer's model and against the initial one. Writes
``OUT_DIR/rank{R}.json``, one file per rank.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from vllm_checks import GUESS_PROMPT, MAX_MODEL_LEN, tiny, train_on_guess

STEPS = 2


def engines_against(engines, weights, tokenizer, prompt, greedy):
    """Each engine's greedy tokens, and how far its log-probs are from a model holding ``weights``."""
    from agilerl.generation.policy import TransformersPolicy

    model, _ = tiny(seed=0)
    model.load_state_dict(dict(weights))
    expected = TransformersPolicy(model, tokenizer, max_model_len=MAX_MODEL_LEN).generate([prompt], greedy)[0]
    out = []
    for engine in engines:
        got = engine.generate([prompt], greedy)[0]
        same = got.token_ids == expected.token_ids
        diff = max(abs(a - b) for a, b in zip(got.logprobs, expected.logprobs)) if same else None
        out.append({"same_tokens": same, "max_logprob_diff": diff})
    return out


def main(out_dir: str, urls: list[str]) -> None:
    from agilerl.generation.policy import SamplingParams
    from agilerl.generation.weights import hf_weights
    from agilerl.manifest.settings import TrainingSettings

    model, tokenizer = tiny(seed=0)
    initial = hf_weights(model)
    if urls:
        from agilerl.generation.vllm.server import VLLMServerPolicy

        policy = VLLMServerPolicy(urls, tokenizer, weights_dir=os.path.join(out_dir, "weights"),
                                  max_model_len=MAX_MODEL_LEN, initial_weights=model)
        engines = [VLLMServerPolicy([url], tokenizer, weights_dir=out_dir, max_model_len=MAX_MODEL_LEN) for url in urls]
    else:
        from agilerl.generation.vllm.policy import VLLMPolicy

        policy = VLLMPolicy(model, tokenizer, max_model_len=MAX_MODEL_LEN, seed=0)
        engines = [policy]
    training = TrainingSettings(
        batch_size=4, group_size=4, max_steps=STEPS, lr=3e-3, max_new_tokens=3, evaluation_interval=STEPS,
        eval_episodes=1, seed=0, output_dir=os.path.join(out_dir, "run"),
    )
    train_on_guess(model, tokenizer, training, policy)
    trained = hf_weights(model)  # gathered whole on every rank (a collective under FSDP2)
    rank = int(os.environ["RANK"])
    prompt = tokenizer.encode(GUESS_PROMPT)
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    report = {
        "sharded": type(next(model.parameters())).__name__ == "DTensor",
        "trained": engines_against(engines, trained, tokenizer, prompt, greedy),
        "initial": engines_against(engines, initial, tokenizer, prompt, greedy),
        "weights_moved": max(float((a - b).abs().max()) for (_, a), (_, b) in zip(trained, initial)),
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":  # vLLM may spawn processes: start engines only here
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    main(sys.argv[1], sys.argv[2:])
