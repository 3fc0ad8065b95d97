"""A test MCP server for exploration, in one of four modes (the first argument):

- `mixed`: `lookup_city` (annotated read-only; refuses unknown cities with an error that
  names the valid ones), `delete_city` (annotated destructive), `send_postcard`
  (unannotated, its name says send) and `city_count` (unannotated, a read); the
  destructive tools write a marker file in the working directory when called.
- `credentials`: every tool answers that an API key is missing.
- `destructive`: only destructive tools.
- `crash`: the only tool kills the server, printing to stderr first.
- `flags`: a read-only tool whose every answer is a 0/1 flag: nothing a trivial reply
  does not also say.

Run as `python tests/integration/mcp_explore_server.py MODE`.
"""

import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

CITIES = {"Lisbon": 545_000, "Oslo": 709_000, "Quito": 2_011_000}
READ = ToolAnnotations(readOnlyHint=True, destructiveHint=False)
DESTROY = ToolAnnotations(readOnlyHint=False, destructiveHint=True)

mode = sys.argv[1] if len(sys.argv) > 1 else "mixed"
server = MCPServer(f"explore-{mode}", log_level="WARNING")


def touched(name: str) -> None:
    Path(f"{name}.called").write_text("called\n")


if mode == "mixed":

    @server.tool(annotations=READ)
    def lookup_city(city: str) -> str:
        """The population of a city."""
        if city not in CITIES:
            raise ToolError(f"unknown city {city!r}; known cities: {', '.join(map(repr, CITIES))}")
        return f"{city} has {CITIES[city]} inhabitants."

    @server.tool()
    def city_count() -> str:
        """How many cities are known."""
        return f"{len(CITIES)} cities"

    @server.tool(annotations=DESTROY)
    def delete_city(city: str) -> str:
        """Remove a city."""
        touched("delete_city")
        return f"deleted {city}"

    @server.tool()
    def send_postcard(city: str) -> str:
        """A postcard to a city."""
        touched("send_postcard")
        return f"sent to {city}"

elif mode == "credentials":

    @server.tool()
    def weather(city: str) -> str:
        """Today's weather in a city."""
        raise ToolError("missing API key: set WEATHER_API_KEY")

    @server.tool()
    def forecast(city: str, days: int = 3) -> str:
        """The forecast for a city."""
        raise ToolError("401 Unauthorized: set WEATHER_API_KEY")

elif mode == "destructive":

    @server.tool(annotations=DESTROY)
    def drop_table(table: str) -> str:
        """Drop a table."""
        touched("drop_table")
        return "dropped"

    @server.tool()
    def purge_cache() -> str:
        """Delete every cached file."""
        touched("purge_cache")
        return "purged"

elif mode == "crash":

    @server.tool()
    def status() -> str:
        """The service's status."""
        print("status: the backend is gone, exiting", file=sys.stderr, flush=True)
        os._exit(3)

elif mode == "flags":

    @server.tool(annotations=READ)
    def feature_enabled(feature: str) -> str:
        """Whether a feature flag is on."""
        return f'{{"feature": "{feature}", "enabled": {int(len(feature) % 2 == 0)}}}'


if __name__ == "__main__":
    server.run("stdio")
