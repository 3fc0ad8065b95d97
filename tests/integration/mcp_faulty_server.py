"""A test MCP server with faults on purpose: a tool that hangs, one that fails, one that
kills the server, and one that works (`echo`). Run as
`python tests/integration/mcp_faulty_server.py`."""

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("faulty", log_level="WARNING")


@server.tool()
def echo(text: str) -> str:
    """Returns its input."""
    return text


@server.tool()
def hang(seconds: float = 600.0) -> str:
    """Sleep for a long time."""
    time.sleep(seconds)
    return "woke up"


@server.tool()
def fail(reason: str) -> str:
    """Always fails with the given reason."""
    raise ToolError(f"failed on purpose: {reason}")


@server.tool()
def crash() -> str:
    """Kills the server process."""
    print("crashing on purpose", file=sys.stderr, flush=True)
    os._exit(7)


if __name__ == "__main__":
    server.run("stdio")
