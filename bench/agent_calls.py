"""The agent endpoint's overhead per call, against calling the policy directly.

1 and 16 programs (processes, each with its own keep-alive HTTP connection) each hold a
conversation of ``--calls`` chat calls, every call extending the last (its reply and a new user
message). The baseline, in the same run, makes the very same generate calls straight on the
policy (the same prompt ids, from the same number of threads, through the same batching
``VersionedPolicy``): greedy, so both generate the same tokens. The difference per call is what
the endpoint costs: HTTP, JSON, the request model, matching the conversation, rendering the new
messages, parsing, recording. The two runs alternate (which goes first, too), and the medians
are compared. On this busy 2-core host the generate calls themselves run slower beside the
program processes, so a second measure, for one program, takes each call's latency less that
call's own generate time, in the same run; and splits it, in the same run, into the transport
(the same program's same calls against a bare socket that makes the same generate calls and
answers canned bytes: the least any HTTP server can cost this client on this host) and the
endpoint's own part (the rest: its HTTP server, the request model, planning, batching, the reply
and the record). And a floor: one program's calls against a scripted policy (no model), the
endpoint's own work per call, median and best. Goal: <= 5% of a call at the tiny model's
generation time.

    python bench/agent_calls.py [--calls 8] [--repeats 3] [--max-new-tokens 8] [--programs 1 16]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

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


_PROGRAM = r"""
import http.client, json, os, sys, time
from urllib.parse import urlparse

url = urlparse(os.environ["OPENAI_BASE_URL"])
connection = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}
messages = [{"role": "user", "content": "Count with me from " + os.environ["AGILERL_EPISODE"] + "."}]
sys.stdin.readline()  # every program starts at once
latencies = []
for _ in range(int(sys.argv[1])):
    start = time.perf_counter()
    connection.request("POST", url.path + "/chat/completions", json.dumps({"model": "m", "messages": messages}), headers)
    reply = json.loads(connection.getresponse().read())
    latencies.append(time.perf_counter() - start)
    messages += [reply["choices"][0]["message"], {"role": "user", "content": "And then?"}]
# the system-wide clock: the interpreter's exit is no part of the calls
print(json.dumps({"end": time.monotonic(), "latencies": latencies}))
"""


class _Timed:
    """The policy, timing each generate call (with one program, each is one call's)."""

    def __init__(self, policy: VersionedPolicy) -> None:
        self.policy = policy
        self.seconds: list[float] = []

    def generate(self, prompts: Any, params: SamplingParams) -> Any:
        start = time.perf_counter()
        try:
            return self.policy.generate(prompts, params)
        finally:
            self.seconds.append(time.perf_counter() - start)


def through_endpoint(
    policy: VersionedPolicy, tokenizer: Any, params: SamplingParams, programs: int, calls: int
) -> tuple[float, float | None, list[list[list[int]]]]:
    """Wall time of the programs' conversations (each a process of its own); with one program,
    the median of a call's latency less its generate time (None with more: calls share a batch);
    and each call's prompt ids (for the baseline)."""
    endpoint = AgentEndpoint(tokenizer)
    timed = _Timed(policy)
    episodes = [endpoint.open_episode(f"e{i}", timed, params) for i in range(programs)]
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _PROGRAM, str(calls)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                env={**os.environ, "OPENAI_BASE_URL": endpoint.base_url, "OPENAI_API_KEY": e.key, "AGILERL_EPISODE": e.id},
            )
            for e in episodes
        ]
        time.sleep(1.0)  # let the interpreters start before the clock does
        start = time.monotonic()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        reports = [json.loads(proc.communicate(timeout=600)[0]) for proc in procs]
        wall = max(report["end"] for report in reports) - start
    finally:
        endpoint.close()
    extra = None
    if programs == 1:
        extra = statistics.median(a - b for a, b in zip(reports[0]["latencies"], timed.seconds))
    prompts = []
    for episode in episodes:
        (sample,) = episode.trajectories()  # every call extended the last: one sample
        mask = sample.action_mask
        starts = [k for k in range(len(mask)) if mask[k] and (k == 0 or not mask[k - 1])]
        prompts.append([sample.token_ids[:k] for k in starts])
    return wall, extra, prompts


_CANNED = json.dumps({
    "id": "chatcmpl-0", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "one two three"}, "finish_reason": "stop", "logprobs": None}],
    "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
}).encode()
_CANNED_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(_CANNED), _CANNED)


def through_raw_socket(policy: VersionedPolicy, params: SamplingParams, prompts: list[list[int]]) -> float:
    """The transport alone, the least any HTTP server can do, same run: one program's calls
    against a bare socket that reads each request, makes the same generate call (the same prompt
    ids) and answers canned bytes of a chat completion's shape (no HTTP server, no request model,
    no planning, batching or record). The median of a call's latency less its own generate."""
    timed, listener = _Timed(policy), socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        connection, _ = listener.accept()
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer = b""

        def more() -> bytes:
            data = connection.recv(65536)
            if not data:  # the program has gone (it failed: its report says so)
                raise ConnectionError("the program closed its connection")
            return data

        with connection, contextlib.suppress(ConnectionError):
            for prompt in prompts:
                while b"\r\n\r\n" not in buffer:
                    buffer += more()
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(buffer) < length:
                    buffer += more()
                buffer = buffer[length:]
                timed.generate([prompt], params)
                connection.sendall(_CANNED_RESPONSE)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _PROGRAM, str(len(prompts))], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "OPENAI_BASE_URL": f"http://127.0.0.1:{listener.getsockname()[1]}/v1",
                 "OPENAI_API_KEY": "k", "AGILERL_EPISODE": "e0"},
        )
        report = json.loads(proc.communicate("go\n", timeout=600)[0])
        server.join(timeout=60)
    finally:
        listener.close()
    return statistics.median(a - b for a, b in zip(report["latencies"], timed.seconds))


def floor(tokenizer: Any, calls: int) -> list[float]:
    """One program's call latencies against a scripted policy (no model): the endpoint alone."""
    import http.client
    from urllib.parse import urlparse

    from agilerl.generation.policy import ScriptedPolicy

    endpoint = AgentEndpoint(tokenizer)
    try:
        episode = endpoint.open_episode("floor", VersionedPolicy(ScriptedPolicy(tokenizer, "one two three")), SamplingParams())
        url = urlparse(endpoint.base_url)
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
        headers = {"Authorization": f"Bearer {episode.key}", "Content-Type": "application/json"}
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Count with me."}]
        latencies = []
        for _ in range(calls):
            start = time.perf_counter()
            connection.request("POST", "/v1/chat/completions", json.dumps({"model": "m", "messages": messages}), headers)
            reply = json.loads(connection.getresponse().read())
            latencies.append(time.perf_counter() - start)
            messages += [reply["choices"][0]["message"], {"role": "user", "content": "And then?"}]
        return latencies
    finally:
        endpoint.close()


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
    _, _, prompts = through_endpoint(policy, tokenizer, params, 2, 2)  # warm up: model, template, loop
    direct(policy, params, prompts)
    alone = floor(tokenizer, 20 * args.calls)
    print(f"floor: the endpoint alone (a scripted policy), per call: median {statistics.median(alone) * 1000:.2f} ms, "
          f"best {min(alone) * 1000:.2f} ms")
    for programs in args.programs:
        endpoint_s, direct_s, extra_s, bare_s = [], [], [], []
        for repeat in range(args.repeats):
            if repeat % 2:  # the baseline first every other time (its prompts from the last run)
                direct_s.append(direct(policy, params, prompts) / args.calls)
            wall, extra, prompts = through_endpoint(policy, tokenizer, params, programs, args.calls)
            endpoint_s.append(wall / args.calls)
            if extra is not None:
                extra_s.append(extra)
                bare_s.append(through_raw_socket(policy, params, prompts[0]))
            if not repeat % 2:
                direct_s.append(direct(policy, params, prompts) / args.calls)
        e, d = statistics.median(endpoint_s), statistics.median(direct_s)
        print(
            f"programs {programs:>2}: per call (each program's calls in turn) direct {d * 1000:.1f} ms, "
            f"through the endpoint {e * 1000:.1f} ms: overhead {(e - d) * 1000:+.2f} ms = {(e - d) / d:+.1%} "
            f"of a call (goal <= 5%; medians of {args.repeats})"
        )
        if extra_s:  # the same run's calls: what the endpoint adds to each, whatever the host does to generate
            x = statistics.median(extra_s)
            print(f"programs {programs:>2}: a call's latency less its own generate, same run: {x * 1000:.2f} ms = "
                  f"{x / d:.1%} of a direct call")
            b = statistics.median(bare_s)
            print(f"programs {programs:>2}: of which the transport alone (the same calls on a bare socket, same run): "
                  f"{b * 1000:.2f} ms = {b / d:.1%}; the endpoint's own: {(x - b) * 1000:.2f} ms = {(x - b) / d:.1%}")


if __name__ == "__main__":
    main()
