"""Collecting rollouts: tasks per group (``assigner``), the policy seam (``policy``), batched
multi-turn collection and evaluation (``collector``)."""
