"""The Guess taskset (its Toolset served over MCP) as a package, for bridge mode."""

from vf_tasks import Guess

__all__ = ["Guess"]
