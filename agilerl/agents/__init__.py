"""Agent programs as environments: the policy served as an OpenAI-compatible endpoint, each
episode's calls recorded as exact tokens and split into samples where history is rewritten.

The names below import on first use (the endpoint pulls in the chat renderer and the tool
parsers): ``agilerl.agents.metrics`` stays light for the trainer."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["AgentCollector", "AgentEndpoint", "AgentOutcome", "AgentRunner", "CommandAgent", "FunctionAgent"]

_HOMES = {
    "AgentCollector": "source",
    "AgentEndpoint": "endpoint",
    "AgentOutcome": "programs",
    "AgentRunner": "programs",
    "CommandAgent": "programs",
    "FunctionAgent": "programs",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'agilerl.agents' has no attribute {name!r}")
    return getattr(importlib.import_module(f"agilerl.agents.{_HOMES[name]}"), name)
