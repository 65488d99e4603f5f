"""Generating tokens: the policies (transformers, vLLM colocated or served, an OpenAI-compatible
endpoint), the weights they are given, and the media they generate with.

A policy is a one-method protocol (``Policy.generate``); everything that plays episodes
(``agilerl.rollout``) or serves the model to a program (the agent endpoint) sits on top of it.
"""
