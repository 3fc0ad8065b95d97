"""A database server whose one query tool runs any SQL it is given, as many published
ones do (the tool names and descriptions of `mcp-alchemy`; no annotations): nothing in
its text shows that it only reads, so rlcoach offers it under the read-only guard.

Run as `python tests/integration/mcp_any_sql_server.py DB_PATH` (an existing database).
"""

import json
import sqlite3
import sys

from mcp.server.mcpserver import MCPServer

connection = sqlite3.connect(sys.argv[1], check_same_thread=False, isolation_level=None)
connection.row_factory = sqlite3.Row
server = MCPServer("any-sql", log_level="WARNING")


@server.tool()
def all_table_names() -> str:
    """Return all table names in the database separated by comma."""
    rows = connection.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
    return ", ".join(row["name"] for row in rows)


@server.tool()
def execute_query(query: str, params: dict | None = None) -> str:
    """Execute a SQL query and return results in a readable format. Results will be
    truncated after 4000 characters."""
    cursor = connection.execute(query, params or {})
    return json.dumps([dict(row) for row in cursor.fetchall()])[:4000]


if __name__ == "__main__":
    server.run("stdio")
