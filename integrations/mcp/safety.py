"""Which tools may be called without a person watching: the rule applied to each tool.

Exploring a server means calling its tools with made-up arguments, and training means
letting a policy call them thousands of times; a tool that deletes, sends or buys must
not be among them unless the user says so. The rule, per tool:

1. **Annotations rule when present.** MCP tools may carry `readOnlyHint`,
   `destructiveHint`, `idempotentHint` and `openWorldHint`. A tool annotated
   `readOnlyHint: true` is safe. A tool with `readOnlyHint: false` (or a
   `destructiveHint` without `readOnlyHint`, which defaults to false) changes its
   environment: unsafe, whether destructive or only additive — an additive write to a
   user's real notes, calendar or memory graph is still a write.
2. **Otherwise the name and description are read as a whole.** A tool whose name or
   description has a word that writes, deletes, sends or buys (`create`, `update`,
   `delete`, `send`, `buy`, ...; see `WRITE_WORDS`) is unsafe; the word is named. A
   description that says the tool is read-only ("read-only", "does not modify") overrides
   the description's words, never the name's.
3. **Running something is judged by what it runs** (`RUN_WORDS`: `execute`, `run`,
   `exec`, ...). "Execute a SELECT query", "runs a read-only search" are reads: the text
   names what is run, and it only reads (`SELECT`, a search, a lookup, a listing). A tool
   that runs something the text does not show to be a read (`run_command`, "Execute
   JavaScript") is unsafe — except a tool that takes SQL ("Execute a SQL query"): it is
   offered under a read-only guard (`sql_guard.py`: every call must hold one statement
   that reads; anything else is refused before it reaches the server).
4. Everything else is safe: reading, searching, computing, converting; the rule names
   the words that read (`get`, `list`, `search`, `SELECT`, ...) when there are any.

Unsafe tools are neither called while exploring nor offered to the policy, unless the
user allows them (`allow_unsafe`, `--allow-unsafe-tools`); the server then runs, as
always, with a private working directory and home (`sandbox`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rlcoach.integrations.mcp.sql_guard import guarded_sql_property

__all__ = [
    "DESCRIPTION_WORDS",
    "READ_WORDS",
    "RUN_WORDS",
    "WRITE_WORDS",
    "ToolSafety",
    "judge_tool",
]

WRITE_WORDS = frozenset(
    [
        "append",
        "apply",
        "approve",
        "archive",
        "assign",
        "book",
        "buy",
        "cancel",
        "change",
        "charge",
        "checkout",
        "clear",
        "commit",
        "create",
        "delete",
        "deploy",
        "destroy",
        "drop",
        "edit",
        "email",
        "erase",
        "forget",
        "install",
        "insert",
        "kill",
        "merge",
        "modify",
        "move",
        "order",
        "overwrite",
        "patch",
        "pay",
        "post",
        "publish",
        "purchase",
        "push",
        "purge",
        "put",
        "refund",
        "remove",
        "rename",
        "replace",
        "reset",
        "restart",
        "revert",
        "rm",
        "save",
        "send",
        "set",
        "shutdown",
        "spend",
        "stop",
        "store",
        "submit",
        "terminate",
        "transfer",
        "truncate",
        "uninstall",
        "update",
        "upload",
        "upsert",
        "wipe",
        "write",
    ]
)
"""Words of a tool's name that mark it as changing something (`add` is not one: a
calculator's `add` reads nothing and writes nothing; annotated servers say more)."""
DESCRIPTION_WORDS = WRITE_WORDS - {
    *[
        "apply",
        "assign",
        "book",
        "change",
        "checkout",
        "clear",
        "email",
        "merge",
        "move",
        "order",
        "patch",
        "post",
        "put",
    ],
    *["replace", "save", "set", "spend", "stop", "store"],
}
"""The same, for descriptions, less the words that are as often nouns there ("in
ascending order", "the store's catalog", "a user's email")."""
RUN_WORDS = frozenset(["exec", "execute", "executes", "run", "runs", "invoke", "perform", "shell"])
"""Words that run something: what they run decides (rule 3)."""
READ_WORDS = frozenset(
    [
        "browse",
        "count",
        "describe",
        "fetch",
        "find",
        "get",
        "inspect",
        "list",
        "lookup",
        "query",
        "read",
        "retrieve",
        "search",
        "select",
        "show",
        "view",
    ]
)
"""Words that read: named in the rule, and what makes a run a read (rule 3)."""
_READ_ONLY = re.compile(
    r"read[- ]?only|does(?: not|n't) (?:modify|change|write|alter)|without (?:modifying|"
    r"changing|side effects)|no side effects|cannot modify",
    re.IGNORECASE,
)
_RUNS_A_READ = re.compile(
    r"\b(?:exec(?:ute)?s?|run?s?|invokes?|performs?)\b[^.;\n]{0,40}?\b(?:select|search|"
    r"lookup|look-up|read[- ]?only|read|query that reads|get|list)\b",
    re.IGNORECASE,
)
"""A run whose object is a read: "Execute a SELECT query", "runs a read-only query"."""
_RUNS_UNPROVEN = " and not that what it runs only reads"
"""The end of rule 3's unsafe verdict: the one a tool that takes SQL is guarded from."""


@dataclass(frozen=True, slots=True)
class ToolSafety:
    """A tool's verdict and the rule that gave it (printed, and in the report)."""

    name: str
    safe: bool
    """Safe to call while exploring and to offer the policy without `allow_unsafe`."""
    rule: str
    allowed: bool
    """Callable in this run: safe, or allowed by the user."""
    guard: str | None = None
    """The property whose SQL must only read (`sql_guard.py`); None without a guard or
    when the user allowed unsafe tools."""


def _words(text: str, stems: bool = False) -> list[str]:
    """Lower-case words, camelCase split; with `stems`, a word ending in -s/-es is also
    given without it ("deletes", "pushes"; not for names, where `list_orders` reads)."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", text)
    words = [w for w in re.split(r"[^A-Za-z]+", spaced.lower()) if w]
    if not stems:
        return words
    out = []
    for word in words:
        out.append(word)
        if word.endswith("es"):
            out.append(word[:-2])
        if word.endswith("s"):
            out.append(word[:-1])
    return out


def _annotations(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    data = raw.model_dump(by_alias=True) if hasattr(raw, "model_dump") else dict(raw)
    return {k: v for k, v in data.items() if v is not None}


def judge_tool(
    name: str,
    description: str,
    annotations: Any = None,
    *,
    allow_unsafe: bool = False,
    schema: dict[str, Any] | None = None,
) -> ToolSafety:
    """The verdict on one tool (see the module docstring); `schema`, its input schema,
    shows whether a tool that runs something takes SQL (then it is guarded)."""
    hints = _annotations(annotations)
    read_only, destructive = hints.get("readOnlyHint"), hints.get("destructiveHint")
    if read_only is not None or destructive is not None:
        if read_only:
            safe, rule = True, "annotated read-only (readOnlyHint=true)"
        elif destructive is False:
            safe, rule = False, "annotated as an additive write (readOnlyHint=false)"
        else:
            safe, rule = False, "annotated as a destructive write (destructiveHint=true)"
    else:
        safe, rule = _read_whole(name, description)
        if not safe and rule.endswith(_RUNS_UNPROVEN):
            sql = guarded_sql_property(schema, description)
            if sql is not None and not allow_unsafe:
                rule = f"{rule}; it takes SQL ({sql!r}): only statements that read are let through"
                return ToolSafety(name, True, rule, True, guard=sql)
    return ToolSafety(name, safe, rule, safe or allow_unsafe)


_PATH_LIKE = re.compile(r"\S*[/\\]\S*")
"""A path or URL in a description ("database /srv/runs/shop.db"): its parts are no words
of the text ("runs" there runs nothing)."""


def _read_whole(name: str, description: str) -> tuple[bool, str]:
    """Rules 2-4 for a tool without annotations: (safe, the rule that decided)."""
    description = _PATH_LIKE.sub(" ", description)
    name_words = _words(name)
    text_words = _words(description, stems=True)
    in_name = [w for w in name_words if w in WRITE_WORDS]
    read_only = _READ_ONLY.search(description)
    in_text = [] if read_only else [w for w in text_words if w in DESCRIPTION_WORDS]
    if in_name:
        return False, f"unannotated; its name says {in_name[0]!r}"
    if in_text:
        return False, f"unannotated; its description says {in_text[0]!r}"
    runs = [w for w in [*name_words, *_words(description)] if w in RUN_WORDS]
    reads = list(dict.fromkeys(w for w in [*name_words, *text_words] if w in READ_WORDS))
    if runs:
        if read_only or _RUNS_A_READ.search(description):
            what = (
                f"says it is read-only ({read_only.group(0)!r})"
                if read_only
                else (f"runs only reads ({', '.join(map(repr, reads[:3]))})")
            )
            return True, f"unannotated; it {what}, so {runs[0]!r} runs a read"
        return False, f"unannotated; it says {runs[0]!r}{_RUNS_UNPROVEN}"
    if read_only:
        return True, f"unannotated; its description says {read_only.group(0)!r}"
    if reads:
        return True, f"unannotated; it reads ({', '.join(map(repr, reads[:3]))}) and writes nothing"
    return True, "unannotated; nothing in its name or description writes"
