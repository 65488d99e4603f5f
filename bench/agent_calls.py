"""The agent endpoint's overhead per call, against calling the policy directly.

1 and 16 programs (threads here, each with its own keep-alive HTTP connection) each hold a
conversation of ``--calls`` chat calls, every call extending the last (its reply and a new user
message). The baseline, in the same run, makes the very same generate calls straight on the
policy (the same prompt ids, from the same number of threads, through the same batching
``VersionedPolicy``): greedy, so both generate the same tokens. The difference per call is what
the endpoint costs: HTTP, JSON, the request model, matching the conversation, rendering the new
messages, parsing, recording. Goal: <= 5% of a call at the tiny model's generation time.

    python bench/agent_calls.py [--calls 8] [--repeats 3] [--max-new-tokens 8] [--programs 1 16]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import threading
import time
from typing import Any
from urllib.parse import urlparse

from agilerl.agents.endpoint import AgentEndpoint
from agilerl.generation.policy import SamplingParams, TransformersPolicy
from agilerl.generation.versioned import VersionedPolicy
from agilerl.train.tiny_model import tiny_model_and_tokenizer


def _threads(count: int, work: Any) -> float:
    """Run ``work(i)`` on ``count`` threads at once; the wall time."""
    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def through_endpoint(policy: VersionedPolicy, tokenizer: Any, params: SamplingParams, programs: int, calls: int) -> tuple[float, list[list[list[int]]]]:
    """Wall time of the programs' conversations, and each call's prompt ids (for the baseline)."""
    endpoint = AgentEndpoint(tokenizer)
    episodes = [endpoint.open_episode(f"e{i}", policy, params) for i in range(programs)]
    url = urlparse(endpoint.base_url)

    def program(i: int) -> None:
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
        headers = {"Authorization": f"Bearer {episodes[i].key}", "Content-Type": "application/json"}
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"Count with me from {i}."}]
        for _ in range(calls):
            connection.request("POST", "/v1/chat/completions", json.dumps({"model": "m", "messages": messages}), headers)
            reply = json.loads(connection.getresponse().read())
            messages += [reply["choices"][0]["message"], {"role": "user", "content": "And then?"}]
        connection.close()

    try:
        wall = _threads(programs, program)
    finally:
        endpoint.close()
    prompts = []
    for episode in episodes:
        (sample,) = episode.trajectories()  # every call extended the last: one sample
        mask = sample.action_mask
        starts = [k for k in range(len(mask)) if mask[k] and (k == 0 or not mask[k - 1])]
        prompts.append([sample.token_ids[:k] for k in starts])
    return wall, prompts


def direct(policy: VersionedPolicy, params: SamplingParams, prompts: list[list[list[int]]]) -> float:
    """The same generate calls, from as many threads, straight on the policy."""

    def program(i: int) -> None:
        for prompt in prompts[i]:
            policy.generate([prompt], params)

    return _threads(len(prompts), program)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--programs", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    model, tokenizer = tiny_model_and_tokenizer()
    policy = VersionedPolicy(TransformersPolicy(model, tokenizer))
    params = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens,
                            stop_token_ids=(tokenizer.convert_tokens_to_ids("<|im_end|>"),))
    through_endpoint(policy, tokenizer, params, 2, 2)  # warm up: the model, the template, the loop
    for programs in args.programs:
        endpoint_s, direct_s = [], []
        for _ in range(args.repeats):
            wall, prompts = through_endpoint(policy, tokenizer, params, programs, args.calls)
            endpoint_s.append(wall / args.calls)
            direct_s.append(direct(policy, params, prompts) / args.calls)
        e, d = statistics.median(endpoint_s), statistics.median(direct_s)
        print(
            f"programs {programs:>2}: per call (each program's calls in turn) direct {d * 1000:.1f} ms, "
            f"through the endpoint {e * 1000:.1f} ms: overhead {(e - d) * 1000:+.2f} ms = {(e - d) / d:+.1%} "
            f"of a call (goal <= 5%; medians of {args.repeats})"
        )


if __name__ == "__main__":
    main()
