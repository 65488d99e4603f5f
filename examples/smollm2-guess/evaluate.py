"""Greedy mean reward of a model folder on the first N targets (seeds 0..N-1), the same for
every model: `python examples/smollm2-guess/evaluate.py model runs/smollm2-guess/checkpoints/step-000030`."""

import sys
from pathlib import Path

from agilerl.assembly.models import load_model_and_tokenizer
from agilerl.manifest.settings import ModelSettings
from agilerl.manifest.spec import load_manifest
from agilerl.rollout.collector import RolloutCollector
from agilerl.generation.policy import SamplingParams, TransformersPolicy

HERE = Path(__file__).resolve().parent
EPISODES = 30

manifest = load_manifest(HERE / "manifest.yaml")
for folder in sys.argv[1:]:
    model, tokenizer = load_model_and_tokenizer(ModelSettings(name_or_path=str(Path(folder).resolve())))
    with RolloutCollector.from_spec(
        manifest.environment, tokenizer, base_dir=manifest.base_dir, batch_size=1, group_size=1,
        sampling=SamplingParams(max_new_tokens=manifest.training.max_new_tokens),
    ) as collector:
        result = collector.evaluate(TransformersPolicy(model, tokenizer), num_episodes=EPISODES)
    print(f"{folder}: greedy mean reward {result.mean_reward:.3f} over {EPISODES} targets")
