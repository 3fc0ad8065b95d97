"""MCP tool servers (`rlcoach.integrations.mcp`, extra `[mcp]`): connect, discover, call.

    from rlcoach.integrations.mcp import ServerSpec, connect, convert_tools
    async with connect(ServerSpec.from_command("python -m mcp_server_time")) as server:
        tools = convert_tools(await server.list_tools())     # OpenAI tool schemas
        check = tools.check_call("get_current_time", '{"timezone": "Etc/UTC"}')
        result = await server.call_tool(check.name, check.arguments)

Training tool use: `run_agent(model, client, spec, scenario, tools)` is one recorded
rollout (the agent loop); `train_on_server(MCPTrainConfig(server=spec))` is the whole
job behind `rlcoach mcp train` (discover, scenarios, evaluate, train, report).

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
from rlcoach.integrations.mcp.connection import (
    Connection,
    MCPServerError,
    ServerSpec,
    ToolResult,
    connect,
)
from rlcoach.integrations.mcp.reward import ruler_rewards
from rlcoach.integrations.mcp.tools import CallCheck, SchemaError, ToolSet, convert_tools
from rlcoach.integrations.mcp.train import MCPTrainConfig, discover, train_on_server

__all__ = [
    "AgentConfig",
    "AgentRun",
    "CallCheck",
    "Connection",
    "Example",
    "MCPServerError",
    "MCPTrainConfig",
    "RolloutTimeoutError",
    "SchemaError",
    "ServerSpec",
    "ToolResult",
    "ToolSet",
    "ToolTimeoutError",
    "build_demonstration",
    "connect",
    "convert_tools",
    "discover",
    "ruler_rewards",
    "run_agent",
    "tool_use_check",
    "train_on_server",
]
