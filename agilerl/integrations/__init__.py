"""Glue for trainers people already use: ``agilerl.integrations.trl`` gives TRL's GRPOTrainer a
``rollout_func`` over any env this project can name. Importing this package imports nothing heavy."""

__all__: list[str] = []
