"""What images cost: the harness per turn, the wire, the collector; each against a baseline
measured in the same run.

1. Harness: a turn whose observation is a 256x256 image and a line of text, against a text-only
   turn (the same line), both through the tiny-vlm processor's harness. The image turn runs the
   processor (resize, patches) on that turn's picture only: its cost is flat in the turn index.
2. Wire: a reset whose observation is a 1 MB PNG (random pixels: PNG cannot shrink them) through
   ``agilerl serve``'s server and our client, against a text reset on the same server.
3. Collector: ``collect`` on the colors env with a scripted policy (no model), against its floor:
   the same episodes' env calls and processor calls alone, one after another.

Run: ``python bench/vision.py``.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from typing import Any

import numpy as np


def _median_us(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


class PictureEnv:
    """Each step shows a fresh 256x256 picture (or none, for the text baseline)."""

    def __init__(self, images: bool) -> None:
        self.images = images
        self.rng = np.random.default_rng(0)

    def reset(self, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        return self._observation("Start."), {}

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return self._observation("What changed in this frame?"), 0.0, False, False, {}

    def _observation(self, text: str) -> Any:
        if not self.images:
            return text
        return {"text": text, "image": self.rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)}


def bench_harness(turns: int, episodes: int) -> None:
    from agilerl.images import ImageLimits
    from agilerl.rollout.harness import RolloutHarness
    from agilerl.generation.media import attach_processor, limit_images
    from agilerl.train.tiny_model import build_tiny_vlm_processor

    tokenizer = attach_processor(build_tiny_vlm_processor(max_pixels=256 * 256))
    limit_images(tokenizer, ImageLimits(max_images=turns + 1))
    results = {}
    for images in (False, True):
        harness = RolloutHarness.local(PictureEnv(images), tokenizer, max_turns=turns)
        first, last = [], []
        for _ in range(episodes):
            harness.reset(seed=0)
            for turn in range(turns):
                t0 = time.perf_counter()
                harness.step("ok")
                spent = time.perf_counter() - t0
                (first if turn == 0 else last if turn == turns - 1 else []).append(spent)
        results[images] = (statistics.median(first) * 1e6, statistics.median(last) * 1e6)
    (t1, tn), (i1, i_n) = results[False], results[True]
    tokens = sum(1 for t in harness.trajectory.token_ids if t == tokenizer.convert_tokens_to_ids("<|image_pad|>")) // (turns + 1)
    print(f"harness turn, text only: {t1:8.0f} us at turn 1, {tn:8.0f} us at turn {turns}")
    print(f"harness turn, 256x256 image ({tokens} image tokens): {i1:8.0f} us at turn 1, {i_n:8.0f} us at turn {turns}"
          f"  -> {i1 / t1:.1f}x the text turn (turn {turns}: {i_n / tn:.1f}x)")


def bench_wire(repeats: int) -> None:
    from PIL import Image

    from agilerl.remote.client import RemoteEnvClient
    from agilerl.remote.hosting import resolve_env

    pixels = np.random.default_rng(1).integers(0, 256, (590, 590, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    png = buffer.getvalue()

    class WireEnv:
        max_turns = 1
        picture = False

        def reset(self, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
            return ({"text": "frame", "image": png} if seed == 1 else "frame"), {}

        def step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
            return "ok", 0.0, True, False, {}

    url, server = resolve_env(WireEnv)
    with server, RemoteEnvClient(url) as client:
        client.reset(seed=0)
        text_us = _median_us(lambda: client.reset(seed=0), repeats)
        image_us = _median_us(lambda: client.reset(seed=1), repeats)
        decoded_us = _median_us(lambda: client.reset(seed=1)[0].images[0].pil(), repeats)
    print(f"wire reset, text: {text_us:8.0f} us; with a {len(png) / 1e6:.2f} MB PNG: {image_us:8.0f} us "
          f"({image_us / text_us:.1f}x; {len(png) / (image_us - text_us):.0f} MB/s of image), decoded to pixels: {decoded_us:8.0f} us")


def bench_collector(repeats: int) -> None:
    from agilerl.builtins.colors import ColorsEnv
    from agilerl.envs.client import InProcessEnvClient
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.generation.policy import SamplingParams, ScriptedPolicy
    from agilerl.generation.media import attach_processor
    from agilerl.rollout.vision import VisionTurns
    from agilerl.train.tiny_model import build_tiny_vlm_processor

    tokenizer = attach_processor(build_tiny_vlm_processor())
    slots, turns = (8, 8), 3
    factory = lambda: ColorsEnv(noise=8, max_turns=turns)  # noqa: E731
    policy = ScriptedPolicy(tokenizer, "9")  # always wrong: every episode plays every turn
    turns_of = VisionTurns.of(tokenizer)

    def floor() -> None:  # each episode's env calls and its processor calls, nothing else
        for slot in range(slots[0] * slots[1]):
            client = InProcessEnvClient(factory())
            prompt, _ = client.reset(seed=slot)
            text = "<|vision_start|><|image_pad|><|vision_end|>" + prompt.text
            turns_of.processor(text=[text], images=[prompt.images[0].pil()], add_special_tokens=False)
            for _ in range(turns):
                client.step("9")

    with RolloutCollector(factory, tokenizer, batch_size=slots[0], group_size=slots[1], seed=0,
                          sampling=SamplingParams(max_new_tokens=2)) as collector:
        collector.collect(policy)  # warm: every slot's env and harness built
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            collector.collect(policy)
            times.append(time.perf_counter() - t0)
        wall = statistics.median(times)
    floor_s = statistics.median([_median_us(floor, 1) / 1e6 for _ in range(repeats)])
    print(f"collector, colors 8x8 slots x {turns} turns, scripted: {wall * 1000:.1f} ms a batch; "
          f"floor (env + processor calls alone): {floor_s * 1000:.1f} ms; ratio to its floor: {wall / floor_s:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    bench_harness(args.turns, args.episodes)
    bench_wire(args.repeats)
    bench_collector(max(3, args.repeats // 3))


if __name__ == "__main__":
    main()
