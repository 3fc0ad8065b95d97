"""MCP tool servers (`rlcoach.integrations.mcp`, extra `[mcp]`): connect, discover, call.

    from rlcoach.integrations.mcp import ServerSpec, connect, convert_tools
    async with connect(ServerSpec.from_command("python -m mcp_server_time")) as server:
        tools = convert_tools(await server.list_tools())     # OpenAI tool schemas
        check = tools.check_call("get_current_time", '{"timezone": "Etc/UTC"}')
        result = await server.call_tool(check.name, check.arguments)

A small server of our own for examples and tests: `python -m rlcoach.integrations.mcp.inventory`.
"""

from rlcoach.integrations.mcp.connection import (
    Connection,
    MCPServerError,
    ServerSpec,
    ToolResult,
    connect,
)
from rlcoach.integrations.mcp.tools import CallCheck, SchemaError, ToolSet, convert_tools

__all__ = [
    "CallCheck",
    "Connection",
    "MCPServerError",
    "SchemaError",
    "ServerSpec",
    "ToolResult",
    "ToolSet",
    "connect",
    "convert_tools",
]
