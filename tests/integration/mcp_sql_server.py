"""A SQL MCP server as users write them with the official SDK: a SQLite file behind
the tools of the published `mcp-server-sqlite` (same names and descriptions, no
annotations), answering with JSON. Two tools write (`write_query`, `create_table`) and
one appends to a memo (`append_insight`); each writes a marker file in the working
directory when called, so a test can tell whether exploring called it.

Run as `python tests/integration/mcp_sql_server.py DB_PATH` (an existing database; the
tests make one from `examples/mcp_servers/shop.sql`); `empty` as DB_PATH serves a
database without tables.
"""

import json
import sqlite3
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

database = sys.argv[1] if len(sys.argv) > 1 else "empty"
connection = sqlite3.connect(
    ":memory:" if database == "empty" else database, check_same_thread=False
)
connection.row_factory = sqlite3.Row
server = MCPServer("sqlite-shop", log_level="WARNING")
insights: list[str] = []


def _rows(sql: str) -> str:
    return json.dumps([dict(row) for row in connection.execute(sql).fetchall()])


def _touched(name: str) -> None:
    Path(f"{name}.called").write_text("called\n")


@server.tool()
def read_query(query: str) -> str:
    """Execute a SELECT query on the SQLite database"""
    if not query.strip().upper().startswith("SELECT"):
        raise ValueError("Only SELECT queries are allowed for read_query")
    return _rows(query)


@server.tool()
def write_query(query: str) -> str:
    """Execute an INSERT, UPDATE, or DELETE query on the SQLite database"""
    _touched("write_query")
    changed = connection.execute(query).rowcount
    return json.dumps([{"affected_rows": changed}])


@server.tool()
def create_table(query: str) -> str:
    """Create a new table in the SQLite database"""
    _touched("create_table")
    connection.execute(query)
    return "Table created successfully"


@server.tool()
def list_tables() -> str:
    """List all tables in the SQLite database"""
    return _rows("SELECT name FROM sqlite_master WHERE type='table'")


@server.tool()
def describe_table(table_name: str) -> str:
    """Get the schema information for a specific table"""
    return _rows(f"PRAGMA table_info({table_name})")


@server.tool()
def append_insight(insight: str) -> str:
    """Add a business insight to the memo"""
    _touched("append_insight")
    insights.append(insight)
    return "Insight added to memo"


if __name__ == "__main__":
    server.run("stdio")
