"""The read-only guard of a tool that runs any SQL it is given.

Many database servers have one tool that executes whatever statement it receives
(`execute_query`, `run_sql`): its text cannot show that it only reads, so by the safety
rule it would be unsafe, and a database server would have nothing to train on. Such a
tool is offered under a guard instead: every call, the explorer's and the policy's, must
carry a single statement that reads (`SELECT`, `WITH ... SELECT`, `EXPLAIN`, `VALUES`,
`SHOW`, `DESCRIBE`, a `PRAGMA` that sets nothing) and names no keyword that writes
outside its string literals; anything else is answered with the reason and never reaches
the server. `--allow-unsafe-tools` lifts the guard.

    read_only_sql_error("SELECT title FROM books WHERE price < 10")   # None: it reads
    read_only_sql_error("DELETE FROM books")   # "'DELETE FROM books' is not a read: ..."
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["guarded_sql_property", "read_only_sql_error"]

_READ_STARTS = frozenset(
    ["select", "with", "explain", "values", "show", "describe", "desc", "pragma"]
)
_WRITES = frozenset(
    [
        *["alter", "attach", "create", "delete", "detach", "drop", "grant", "insert"],
        *["into", "lock", "merge", "reindex", "revoke", "truncate", "update", "upsert"],
        "vacuum",
        # functions with side effects (SQLite, PostgreSQL)
        *["load_extension", "lo_export", "lo_import", "nextval", "setval", "set_config"],
        *["pg_terminate_backend", "pg_cancel_backend", "pg_reload_conf", "dblink_exec"],
    ]
)
"""Keywords that change something inside a statement that starts as a read (`SELECT ...
INTO t` makes a table, `WITH d AS (DELETE ...)` deletes, `FOR UPDATE` locks): a read
never needs them. Statements that start otherwise are refused by their first word."""
_LITERALS = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`|\[[^\]]*\]")
_COMMENTS = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)


def read_only_sql_error(statement: Any) -> str | None:
    """None when `statement` is one statement that only reads; else why it is refused."""
    if not isinstance(statement, str):
        return f"{statement!r} is not an SQL statement (a string)"
    shown = statement if len(statement) <= 80 else statement[:77] + "..."
    bare = _LITERALS.sub(" '' ", _COMMENTS.sub(" ", statement)).strip().rstrip(";").strip()
    words = re.findall(r"[A-Za-z_]+", bare.lower())
    if not words:
        return f"{shown!r} holds no statement"
    if ";" in bare:
        return f"{shown!r} holds several statements; this run lets through one read at a time"
    fix = "write a single SELECT (this run lets through only statements that read)"
    if words[0] not in _READ_STARTS:
        return f"{shown!r} is not a read: it starts with {words[0].upper()}; {fix}"
    writes = [w for w in words if w in _WRITES]
    if words[0] == "pragma" and "=" in bare:
        writes.insert(0, "=")
    if writes:
        return f"{shown!r} is not a read: it says {writes[0].upper()}; {fix}"
    return None


def guarded_sql_property(schema: dict[str, Any] | None, tool_description: str) -> str | None:
    """The property of a tool's input that takes SQL, when it has exactly one."""
    from rlcoach.integrations.mcp.chaining import is_sql_property

    properties = (schema or {}).get("properties") or {}
    found = [
        name
        for name, prop in properties.items()
        if isinstance(prop, dict)
        and prop.get("type", "string") == "string"
        and is_sql_property(name, prop, tool_description)
    ]
    return found[0] if len(found) == 1 else None
