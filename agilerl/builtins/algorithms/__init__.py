"""The built-in algorithms, registered by name in ``agilerl.builtins.registrations``.

Rollout: ``grpo``, ``cispo``, ``gspo`` (group-relative), ``llmppo`` (value head, GAE),
``llmreinforce``. Dataset: ``sft``, ``dpo``. Each module imports torch; nothing here does.
"""
