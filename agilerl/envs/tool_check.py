"""``check_env``'s protocol step for an env that takes parsed tool calls (``tool_parser`` set).

The first scripted completion goes through the tool parser, as a run sends it: each call that
checks out against the env's tools becomes ``call_tool(name, arguments)``, and its result is
checked as a step's; a completion without a call is a text ``step``, unless the env takes only
calls (an OpenEnv MCP env without ``mcp_tool``, in process or served). The env's tools are
checked as a ``ToolSet`` is built, so an unreadable schema is a problem naming the tool.
"""

from __future__ import annotations

from typing import Any

from agilerl.envs.client import EnvClient, InProcessEnvClient
from agilerl.envs.openenv_native import OpenEnvTextEnv
from agilerl.errors import EnvProtocolError
from agilerl.protocol import step_problems
from agilerl.tools import ToolSet, resolve_tool_parser

__all__ = ["takes_only_calls", "tool_step", "tools_problem"]


def takes_only_calls(target: Any) -> bool:
    """Whether ``target`` (an env, or a client) reaches an OpenEnv MCP env without ``mcp_tool``:
    in process, or served (then its server must have answered ``tools/list``)."""
    env = target.env if isinstance(target, InProcessEnvClient) else getattr(target, "inner", target)
    if isinstance(env, OpenEnvTextEnv):
        return env.mcp and not env.mcp_tool
    if env is not target:  # a wrapping client: what it wraps says
        return takes_only_calls(env)
    return getattr(env, "mcp_tool", "") is None and bool(getattr(env, "serves_mcp", False))


def tools_problem(tools: Any) -> str | None:
    """Why ``tools`` cannot be a tool set (a tool without a name, a schema the checker cannot
    read), naming the tool and the keyword; None when they can."""
    try:
        ToolSet(tools)
    except EnvProtocolError as exc:
        return str(exc)
    return None


def tool_step(env: Any, tool_parser: Any, action: str, info: dict[str, Any], report: Any, call: Any) -> None:
    """Play ``action`` through ``tool_parser`` against ``env`` (after its reset gave ``info``),
    adding to ``report``'s problems and notes; ``call(report, what, fn, *args)`` runs one env
    method, reporting what it raises (None then)."""
    parser = resolve_tool_parser(tool_parser, None)
    tools = info.get("tools") if isinstance(info, dict) else None
    if not tools:
        listed = getattr(env, "list_tools", None)
        tools = listed() if callable(listed) else None
    if not tools:
        tools = env.describe().tools if isinstance(env, EnvClient) else getattr(env, "tools", None)
    if (problem := tools_problem(tools)) is not None:
        report.problems.append(problem)
        return
    parsed = parser.parse_text(action, ToolSet(tools))
    if not parsed.calls:
        if takes_only_calls(env):
            report.notes.append(
                f"the check's step plays the first scripted action through the {parser.name} parser, and it "
                "holds no tool call: this env takes only calls (--action with a call checks call_tool)"
            )
            return
        result = call(report, f"step({parsed.content!r:.60})", env.step, parsed.content)
        if result is not None:
            report.problems += step_problems(result)
        return
    for parsed_call in parsed.calls:
        name, arguments = parsed_call.name, parsed_call.arguments
        if not parsed_call.ok:
            report.notes.append(f"the scripted call {name or '?'} is {parsed_call.status}: {parsed_call.error}")
            continue
        result = call(report, f"call_tool({name!r})", env.call_tool, name, arguments)
        if result is None:
            return
        report.problems += step_problems(result, "call_tool")
        if isinstance(result, tuple) and len(result) == 5 and (result[2] is True or result[3] is True):
            return  # the call ended the episode

