"""The weight push to ``vllm serve`` replicas: through a shared folder (``disk``) against vLLM's
weight-transfer protocol over gloo (``gloo``), interleaved, on the same replicas and weights.

    .venv-vllm/bin/python bench/vllm_push.py                         # SmolLM2-135M, 2 replicas
    .venv-vllm/bin/python bench/vllm_push.py --model tiny --rounds 5  # quick

A push is ``VLLMServerPolicy.load_weights(hf_weights(model))`` as the training loop makes it
after each optimiser step: until every replica holds the new weights and has reset its prefix
cache. The replicas run with ``--weight-transfer-config '{"backend": "agilerl_gloo"}'``, which
leaves the disk path as it is, so both pushes reach the same servers. Each round pushes both
ways, in a rotated order; the first round is warm-up (the gloo group is opened there) and the
median of the others is reported.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from tests.vllm_serve import VLLMServe  # noqa: E402
from vllm_step import load  # noqa: E402

WAYS = ("disk", "gloo")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", choices=["tiny", "smollm2"])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()

    from agilerl.generation.vllm.server import VLLMServerPolicy
    from agilerl.generation.weights import hf_weights

    model, tokenizer = load(args.model)
    with tempfile.TemporaryDirectory(prefix="agilerl-push-") as tmp:
        folder = Path(tmp)
        model.save_pretrained(folder / "model")
        tokenizer.save_pretrained(folder / "model")
        servers = [
            VLLMServe(
                Path(sys.executable), folder / "model", folder / f"replica{i}.log", "--max-model-len", "512",
                "--weight-transfer-config", '{"backend": "agilerl_gloo"}',
                env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
            )
            for i in range(args.replicas)
        ]
        try:
            urls = [server.wait_healthy() for server in servers]
            policies = {
                "disk": VLLMServerPolicy(urls, tokenizer, weights_dir=folder / "weights"),
                "gloo": VLLMServerPolicy(urls, tokenizer, weight_transfer="gloo"),
            }
            times: dict[str, list[float]] = {way: [] for way in WAYS}
            for round_ in range(args.rounds + 1):
                for way in WAYS[round_ % 2 :] + WAYS[: round_ % 2]:
                    start = time.perf_counter()
                    policies[way].load_weights(hf_weights(model))
                    if round_:  # the first is warm-up
                        times[way].append(time.perf_counter() - start)
            for policy in policies.values():
                policy.close()
        finally:
            for server in servers:
                server.stop()
    size = sum(t.numel() * t.element_size() for _, t in hf_weights(model)) / 2**20
    disk, gloo = (statistics.median(times[way]) for way in WAYS)
    print(f"{args.model}: {size:.0f} MiB to {args.replicas} replicas, median of {args.rounds}")
    print(f"  disk {disk:.3f} s   gloo {gloo:.3f} s   disk/gloo {disk / gloo:.2f}x")


if __name__ == "__main__":
    main()
