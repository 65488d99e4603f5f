"""Rollouts: the harness (text <-> tokens), trajectories, and the batched collector."""
