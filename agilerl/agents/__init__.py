"""Agent programs as environments: the policy served as an OpenAI-compatible endpoint, each
episode's calls recorded as exact tokens and split into samples where history is rewritten."""

from agilerl.agents.endpoint import AgentEndpoint
from agilerl.agents.programs import AgentOutcome, AgentRunner, CommandAgent, FunctionAgent
from agilerl.agents.source import AgentCollector

__all__ = ["AgentCollector", "AgentEndpoint", "AgentOutcome", "AgentRunner", "CommandAgent", "FunctionAgent"]
