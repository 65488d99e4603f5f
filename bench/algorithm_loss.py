"""Cost of each algorithm's loss + backward against a plain NLL step on the same batch.

The baseline is what any trainer pays anyway: one forward pass, token log-probs, a masked mean
and backward. The ratio is what advantages, ratios, GAE and value heads add on top. Rows marked
"sampler log-probs" carry a perturbed copy's log-probs, so the off-policy correction (weights,
masks, its metrics) runs in full; the same algorithm's row without them is its cost's baseline,
in the same run. Also times ``collate_trajectories`` against the baseline step.
Run: ``python bench/algorithm_loss.py [--rounds 9] [--batch 16]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import replace
from functools import partial

import torch

from agilerl.train.tiny_model import build_tiny_model, build_tiny_tokenizer
from agilerl.builtins.algorithms.off_policy import off_policy_correction
from agilerl.train.algorithm import build_algorithm
from agilerl.train.batch import collate_trajectories
from agilerl.train.logprobs import masked_mean, policy_logprobs
from agilerl.rollout.trajectory import Trajectory

BATCH, GROUP, TURNS, PROMPT, COMPLETION, OBSERVATION = 16, 8, 6, 64, 40, 12


def rollouts(vocab: int, batch: int = BATCH) -> list[Trajectory]:
    rng = random.Random(0)
    out = []
    for index in range(batch):
        turns = rng.randint(1, TURNS)
        traj = Trajectory(group=index // GROUP, rewards=[rng.random() for _ in range(turns)])
        traj.token_ids = [rng.randrange(vocab) for _ in range(PROMPT)]
        traj.action_mask, traj.turn_ids = [False] * PROMPT, [-1] * PROMPT
        for turn in range(turns):
            traj.token_ids += [rng.randrange(vocab) for _ in range(COMPLETION + OBSERVATION)]
            traj.action_mask += [True] * COMPLETION + [False] * OBSERVATION
            traj.turn_ids += [turn] * (COMPLETION + OBSERVATION)
        out.append(traj)
    return out


def sampler_logprobs(model, batch) -> torch.Tensor:
    """Log-probs as a sampler a little off the trainer reports them (another engine, older weights)."""
    with torch.no_grad():
        exact = policy_logprobs(model, batch.input_ids, batch.attention_mask)
    noise = 0.3 * torch.randn(exact.shape, generator=torch.Generator().manual_seed(0))
    return (exact + noise) * batch.action_mask


def seconds(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def loss_step(algorithm, policy, batch, reference) -> None:
    policy.zero_grad()
    algorithm.loss(policy, batch, reference)[0].backward()


def paired(step, baseline, rounds: int) -> tuple[float, float]:
    """Median time of ``step`` and median of its per-round ratio to ``baseline``, interleaved
    so that load from other processes hits both alike."""
    step(), baseline()  # warm-up
    timings = [(seconds(step), seconds(baseline)) for _ in range(rounds)]
    return statistics.median(t for t, _ in timings), statistics.median(t / b for t, b in timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds per algorithm")
    parser.add_argument("--batch", type=int, default=BATCH, help=f"trajectories in the batch, in groups of {GROUP}")
    args = parser.parse_args()
    rounds = args.rounds
    torch.manual_seed(0)
    torch.set_num_threads(2)
    tokenizer = build_tiny_tokenizer("chatml")
    model = build_tiny_model(tokenizer)
    trajs = rollouts(len(tokenizer), args.batch)
    batch = collate_trajectories(trajs, pad_id=tokenizer.pad_token_id)
    reference = build_tiny_model(tokenizer, seed=1).eval()
    sampled = replace(batch, old_logprobs=sampler_logprobs(model, batch))

    def baseline() -> None:
        model.zero_grad()
        logprobs = policy_logprobs(model, batch.input_ids, batch.attention_mask)
        (-masked_mean(logprobs, batch.loss_mask)).backward()

    base, _ = paired(baseline, baseline, rounds)
    collate, collate_ratio = paired(lambda: collate_trajectories(trajs, pad_id=0), baseline, rounds)
    print(f"batch {tuple(batch.input_ids.shape)}, {int(batch.loss_mask.sum())} action tokens")
    print(f"baseline NLL step: {base * 1e3:.1f} ms")
    print(f"collate_trajectories: {collate * 1e3:.2f} ms ({collate_ratio:.3f}x baseline)")
    config = build_algorithm({"name": "grpo"}).config
    trainer = sampled.old_logprobs + 0.01  # any detached log-probs: the correction's cost is shape-bound
    correct = partial(off_policy_correction, trainer, sampled.old_logprobs, sampled.loss_mask, config)
    took, correct_ratio = paired(correct, baseline, rounds)
    print(f"off-policy correction alone: {took * 1e3:.2f} ms ({correct_ratio:.4f}x baseline)")
    print("| algorithm | ms/step | vs baseline |\n|---|---|---|")
    for section, with_sampler in (
        ({"name": "grpo"}, False),
        ({"name": "grpo"}, True),
        ({"name": "grpo", "beta": 0.04}, False),
        ({"name": "cispo"}, False),
        ({"name": "cispo"}, True),
        ({"name": "gspo"}, False),
        ({"name": "gspo"}, True),
        ({"name": "llmppo", "advantage_granularity": "token"}, False),
        ({"name": "llmppo", "advantage_granularity": "token"}, True),
        ({"name": "llmppo", "advantage_granularity": "turn"}, False),
        ({"name": "llmreinforce", "advantage_granularity": "token"}, False),
        ({"name": "llmreinforce", "advantage_granularity": "token"}, True),
    ):
        algorithm = build_algorithm(section)
        policy = algorithm.prepare_policy(model)
        rows = sampled if with_sampler else batch
        took, ratio = paired(partial(loss_step, algorithm, policy, rows, reference), baseline, rounds)
        labels = [f"{k}={v}" for k, v in section.items() if k != "name"] + ["sampler log-probs"] * with_sampler
        name = f"{section['name']} ({', '.join(labels)})" if labels else section["name"]
        print(f"| {name} | {took * 1e3:.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
