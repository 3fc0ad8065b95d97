"""MCP tool servers (`rlcoach.integrations.mcp`, extra `[mcp]`): connect, discover, call.

    from rlcoach.integrations.mcp import ServerSpec, connect, convert_tools
    async with connect(ServerSpec.from_command("python -m mcp_server_time")) as server:
        tools = convert_tools(await server.list_tools())     # OpenAI tool schemas
        check = tools.check_call("get_current_time", '{"timezone": "Etc/UTC"}')
        result = await server.call_tool(check.name, check.arguments)

Training tool use: `run_agent(model, client, spec, scenario, tools)` is one recorded
rollout (the agent loop); `train_on_server(MCPTrainConfig(server=spec))` is the whole
job behind `rlcoach mcp train` (discover, judge each tool's safety, explore the safe ones
with synthesized and chained arguments, grounded scenarios and reward, evaluate, warm
up, train keeping the best checkpoint by held-out success, report).

A small server of our own for examples and tests: `python -m rlcoach.integrations.mcp.inventory`.
"""

from rlcoach.integrations.mcp.agent import (
    AgentConfig,
    AgentRun,
    Example,
    RolloutTimeoutError,
    ToolTimeoutError,
    build_demonstration,
    run_agent,
    tool_use_check,
)
from rlcoach.integrations.mcp.chaining import DataModel
from rlcoach.integrations.mcp.connection import (
    Connection,
    MCPServerError,
    ServerSpec,
    ToolResult,
    connect,
)
from rlcoach.integrations.mcp.discovery import discover
from rlcoach.integrations.mcp.explore import Exploration, explore
from rlcoach.integrations.mcp.reward import grounded_check, ruler_rewards
from rlcoach.integrations.mcp.safety import ToolSafety, judge_tool
from rlcoach.integrations.mcp.selection import HeldOutCurve
from rlcoach.integrations.mcp.synthesis import ArgumentSynthesizer
from rlcoach.integrations.mcp.tools import CallCheck, SchemaError, ToolSet, convert_tools
from rlcoach.integrations.mcp.train import MCPTrainConfig, train_on_server

__all__ = [
    "AgentConfig",
    "AgentRun",
    "ArgumentSynthesizer",
    "CallCheck",
    "Connection",
    "DataModel",
    "Example",
    "Exploration",
    "HeldOutCurve",
    "MCPServerError",
    "MCPTrainConfig",
    "RolloutTimeoutError",
    "SchemaError",
    "ServerSpec",
    "ToolResult",
    "ToolSafety",
    "ToolSet",
    "ToolTimeoutError",
    "build_demonstration",
    "connect",
    "convert_tools",
    "discover",
    "explore",
    "grounded_check",
    "judge_tool",
    "ruler_rewards",
    "run_agent",
    "tool_use_check",
    "train_on_server",
]
