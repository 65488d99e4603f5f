"""Training: the algorithm contract, rollout batches, token log-probs, the loops (torch and
accelerate underneath). Users import these names from ``agilerl.llm_envs``."""
