"""What tests/test_vllm_server.py asserts of the ``gloo`` weight transfer, computed in ``.venv-vllm``
(the trainer side drives vLLM's own trainer engine, so it needs vllm):

    .venv-vllm/bin/python tests/vllm_transfer_check.py REPORT.json URL [URL ...]

The replicas run with ``--weight-transfer-config '{"backend": "agilerl_gloo"}'``. Two pushes
through one group (the first opens it), each followed by a greedy check of every replica alone
against ``TransformersPolicy`` on the pushed weights; a third after another trainer took the
replicas over; generation while one, then both, hold other weights; then a refused backend.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import warnings

from vllm_checks import MAX_MODEL_LEN, tiny


def replicas_agree_with(model, tokenizer, urls, report, key):
    """Each replica's greedy tokens and log-probs against the trainer's model's."""
    from agilerl.generation.policy import SamplingParams, TransformersPolicy
    from agilerl.generation.vllm.server import VLLMServerPolicy

    prompt = tokenizer.encode("<|im_start|>user\nguess a number<|im_end|>\n<|im_start|>assistant\n")
    greedy = SamplingParams(temperature=0, max_new_tokens=8, stop_token_ids=(tokenizer.eos_token_id,))
    expected = TransformersPolicy(model, tokenizer, max_model_len=MAX_MODEL_LEN).generate([prompt], greedy)[0]
    report[key] = []
    for url in urls:
        one = VLLMServerPolicy([url], tokenizer, weight_transfer="gloo", max_model_len=MAX_MODEL_LEN)  # pushes nothing
        got = one.generate([prompt], greedy)[0]
        one.close()
        report[key].append({
            "same_tokens": got.token_ids == expected.token_ids,
            "max_logprob_diff": max(abs(a - b) for a, b in zip(got.logprobs, expected.logprobs)),
        })


def main(report_path: str, urls: list[str]) -> None:
    from agilerl.errors import EndpointError
    from agilerl.generation.policy import SamplingParams, TransformersPolicy
    from agilerl.generation.vllm.server import VLLMServerPolicy
    from agilerl.generation.weights import hf_weights

    report: dict = {}
    model, tokenizer = tiny(seed=3)
    start = time.perf_counter()
    policy = VLLMServerPolicy(urls, tokenizer, weight_transfer="gloo", max_model_len=MAX_MODEL_LEN, initial_weights=model)
    report["first_push_s"] = time.perf_counter() - start  # the group is opened here
    replicas_agree_with(model, tokenizer, urls, report, "first")
    model, _ = tiny(seed=4)
    start = time.perf_counter()
    policy.load_weights(hf_weights(model))
    report["second_push_s"] = time.perf_counter() - start
    replicas_agree_with(model, tokenizer, urls, report, "second")

    # another trainer takes the replicas over (as a restart would, it leaves this group behind):
    # the next push opens a new group instead of broadcasting to peers that left
    other = VLLMServerPolicy(urls, tokenizer, weight_transfer="gloo", initial_weights=tiny(seed=5)[0])
    other.close()
    model, _ = tiny(seed=6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        policy.load_weights(hf_weights(model))
    report["reopened_warning"] = [str(w.message) for w in caught if "new weight-transfer group" in str(w.message)]
    replicas_agree_with(model, tokenizer, urls, report, "after_takeover")

    # one replica leaves for another trainer: generation goes on, on the other one only
    other = VLLMServerPolicy(urls[1:], tokenizer, weight_transfer="gloo", initial_weights=tiny(seed=8)[0])
    other.close()
    prompt = tokenizer.encode("<|im_start|>user\nguess a number<|im_end|>\n<|im_start|>assistant\n")
    greedy = SamplingParams(temperature=0, max_new_tokens=8, stop_token_ids=(tokenizer.eos_token_id,))
    prompts = [prompt, prompt[:-1], prompt[:-2]]  # three groups: the second was due on the replica that left
    expected = TransformersPolicy(model, tokenizer, max_model_len=MAX_MODEL_LEN).generate(prompts, greedy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        generated = policy.generate(prompts, greedy)
    report["left_out_warning"] = [str(w.message) for w in caught if "until the next push" in str(w.message)]
    report["left_out_same_tokens"] = [g.token_ids for g in generated] == [e.token_ids for e in expected]
    # and none left holding the last push: generation stops with what to do
    VLLMServerPolicy(urls[:1], tokenizer, weight_transfer="gloo", initial_weights=tiny(seed=8)[0]).close()
    try:
        policy.generate([prompt], greedy)
        report["none_left"] = None
    except EndpointError as exc:
        report["none_left"] = str(exc)
    policy.close()

    with tempfile.TemporaryDirectory() as unused:
        wrong = VLLMServerPolicy(urls, tokenizer, weight_transfer="nccl", weights_dir=unused)
        try:
            wrong.load_weights(hf_weights(model))
            report["refusal"] = None
        except EndpointError as exc:
            report["refusal"] = str(exc)
        wrong.close()
    with open(report_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
