"""Chained calls: what one tool returns becomes the arguments of the next.

Exploring a database server one tool at a time finds little: a `read_query(query)` tool
needs SQL that names real tables and columns, and the questions a user asks ("who wrote
Dune?") need real values. `DataModel` learns the data behind a server from the answers
exploring gets:

- a listing of tables (`list_tables`, or `SELECT name FROM sqlite_master`): rows with one
  `name`-like key, or a list of names from a tool about tables;
- a table's columns (`describe_table(table_name="books")`): rows with `name` and `type`
  keys, for the table the call named;
- rows (`SELECT * FROM books LIMIT 5`): the real values, per table and column.

`DataModel.queries()` then writes SELECTs from what it knows, each with the question a
user would ask and the call it depends on: first one listing per table, then lookups
(`SELECT price FROM books WHERE title = 'Dune'` — "What is the price of the book whose
title is Dune?"), counts with and without a WHERE on a real value, the highest and lowest
by a numeric column, and two-step questions over a foreign key (`books.author_id` →
`authors.id`: "What is the name of the author of the book whose title is Dune?"), whose
second query uses the value the first returned. The tool's results are parsed as JSON or
as a Python literal (many servers answer with `str(rows)`).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

from rlcoach.autorl.facts import keyed_records

__all__ = ["DataModel", "Query", "is_sql_property", "parse_result", "rows_in"]

_NAME_KEYS = ("name", "table_name", "tbl_name", "table", "tablename")
_FROM = re.compile(r"\bfrom\s+[\"`\[]?(\w+)", re.IGNORECASE)


def parse_result(text: str) -> Any:
    """A tool's answer as data: JSON, else a Python literal, else records of `Key: value`
    lines separated by blank lines ("1. row / title: Dune / price: 9.5", as rows with
    their numbers read), else None."""
    text = text.strip()
    if not text or text[0] not in "[{":
        records = keyed_records(text)
        return [{k: _number(v) for k, v in r.items()} for r in records] if records else None
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def _number(value: str) -> Any:
    if re.fullmatch(r"-?\d+", value):
        return int(value)
    if re.fullmatch(r"-?\d+\.\d+", value):
        return float(value)
    return None if value in ("None", "NULL", "null") else value


def rows_in(data: Any) -> list[dict[str, Any]] | None:
    """The rows of a tabular answer: a list of objects, or one object holding such a list
    (`{"rows": [...]}`); None when it is not one."""
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        data = lists[0] if len(lists) == 1 else None
    if isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
        return data
    return None


def is_sql_property(name: str, schema: dict[str, Any], tool_description: str) -> bool:
    """Whether a string property takes SQL: named `sql`/`query`/`statement` and the
    property or the tool speaks of SQL or SELECT."""
    text = f"{schema.get('description', '')} {tool_description}"
    named = re.search(r"sql|query|statement", name, re.IGNORECASE)
    return bool(named and re.search(r"\bsql|\bselect\b", text, re.IGNORECASE))


@dataclass(frozen=True, slots=True)
class Query:
    """A SELECT written from what exploring learned."""

    sql: str
    question: str
    """What a user would ask that this query answers (empty for a plain listing)."""
    after: int | None = None
    """The exploration call whose answer gave this query its value (a two-step task)."""
    first: str = ""
    """For a two-step question: the query a careful agent runs first."""


def _singular(table: str) -> str:
    word = table.lower().replace("_", " ")
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(("ses", "xes")):
        return word[:-2]
    return word[:-1] if word.endswith("s") and not word.endswith("ss") else word


def _literal(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "NULL"
    if isinstance(value, int | float):
        return json.dumps(value)
    return "'" + str(value).replace("'", "''") + "'"


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass
class DataModel:
    """Tables, columns and rows learned from a server's answers (see the module docstring)."""

    tables: dict[str, dict[str, str]] = field(default_factory=dict)
    """Per table, its columns and their declared types ("" when unknown)."""
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Per table, rows read from it (the answer to `SELECT * FROM t`)."""
    source: dict[str, int] = field(default_factory=dict)
    """Per table (and `table.rows`), the exploration call that taught it."""

    def learn(self, tool: str, arguments: dict[str, Any], result: str, call: int) -> None:
        """Learn from one call's answer; `call` is its index among the calls that worked."""
        data = parse_result(result)
        rows = rows_in(data)
        sql = next((v for v in arguments.values() if isinstance(v, str) and _FROM.search(v)), "")
        named = [v for v in arguments.values() if isinstance(v, str) and not _FROM.search(v)]
        if rows is None:
            names = isinstance(data, list) and data and all(isinstance(v, str) for v in data)
            if names and "table" in tool.lower() and not arguments:
                self._add_tables(data, call)
            return
        keys = set().union(*(r.keys() for r in rows))
        if {"name", "type"} <= keys and named:
            table = named[0]
            columns = {str(r["name"]): str(r.get("type") or "") for r in rows if r.get("name")}
            self.tables.setdefault(table, {}).update(columns)
            self.source.setdefault(table, call)
            return
        listing = not sql or "sqlite_master" in sql or "information_schema" in sql
        if len(keys) == 1 and next(iter(keys)).lower() in _NAME_KEYS and listing:
            key = next(iter(keys))
            self._add_tables([str(r[key]) for r in rows if r.get(key)], call)
            return
        if sql and re.match(r"\s*select\s+\*\s+from", sql, re.IGNORECASE):
            table = _FROM.search(sql).group(1)  # type: ignore[union-attr]
            columns = self.tables.setdefault(table, {})
            for key in keys:
                columns.setdefault(str(key), "")
            known = self.rows.setdefault(table, [])
            known += [r for r in rows if r not in known][: max(0, 12 - len(known))]
            self.source.setdefault(f"{table}.rows", call)

    def _add_tables(self, names: list[str], call: int) -> None:
        for name in names:
            if not name.startswith("sqlite_"):
                self.tables.setdefault(name, {})
                self.source.setdefault(name, call)

    def queries(self) -> list[Query]:
        """SELECTs to try next, best first (see the module docstring)."""
        if not self.tables:
            return [
                Query("SELECT name FROM sqlite_master WHERE type='table'", ""),
                Query("SELECT table_name FROM information_schema.tables", ""),
            ]
        out: list[Query] = []
        for table in self.tables:
            if table not in self.rows:
                out.append(Query(f"SELECT * FROM {table} LIMIT 5", "", self.source.get(table)))
        content: list[list[Query]] = [self._about(t) for t in self.rows]
        # one of each table's in turn, so a few calls cover every table
        for index in range(max((len(c) for c in content), default=0)):
            out += [c[index] for c in content if index < len(c)]
        return out

    def _about(self, table: str) -> list[Query]:
        """Questions about one table's content, from its rows."""
        rows = self.rows[table]
        after = self.source.get(f"{table}.rows")
        columns = list(rows[0])
        noun = _singular(table)
        texts = [
            c
            for c in columns
            if all(isinstance(r.get(c), str) for r in rows)
            and len({r.get(c) for r in rows}) == len(rows)
        ]
        numbers = [
            c for c in columns if all(_numeric(r.get(c)) for r in rows) and not _is_key(c, table)
        ]
        repeated = [
            c
            for c in columns
            if len({json.dumps(r.get(c)) for r in rows}) < len(rows)
            and not _is_key(c, table)
            and all(r.get(c) is not None for r in rows)
        ]
        out: list[Query] = []
        if not texts:
            return [Query(f"SELECT COUNT(*) FROM {table}", f"How many {table} are there?", after)]
        key = texts[0]
        for index, row in enumerate(rows[:3]):
            value = row[key]
            targets = [c for c in columns if c != key and not _is_key(c, table)]
            if targets:
                target = targets[index % len(targets)]
                out.append(
                    Query(
                        f"SELECT {target} FROM {table} WHERE {key} = {_literal(value)}",
                        f"What is the {_words(target)} of the {noun} whose {_words(key)} is "
                        f"{value}?",
                        after,
                    )
                )
            out += self._two_step(table, key, value, row)
        out.append(Query(f"SELECT COUNT(*) FROM {table}", f"How many {table} are there?", after))
        for column in repeated[:2]:
            value = rows[0][column]
            out.append(
                Query(
                    f"SELECT COUNT(*) FROM {table} WHERE {column} = {_literal(value)}",
                    f"How many {table} have {_words(column)} {value}?",
                    after,
                )
            )
        for column in numbers[:2]:
            for order, word in (("DESC", "highest"), ("ASC", "lowest")):
                out.append(
                    Query(
                        f"SELECT {key}, {column} FROM {table} ORDER BY {column} {order} LIMIT 1",
                        f"Which {noun} has the {word} {_words(column)}? Give its "
                        f"{_words(key)} and {_words(column)}.",
                        after,
                    )
                )
        return out

    def _two_step(self, table: str, key: str, value: Any, row: dict[str, Any]) -> list[Query]:
        """Questions over a foreign key (`author_id` -> `authors`): the second query needs
        the first one's answer."""
        out = []
        for column, linked in row.items():
            other = _linked_table(column, self.tables)
            if other is None or other == table or other not in self.rows:
                continue
            other_rows = self.rows[other]
            match = next((r for r in other_rows if linked in r.values()), None)
            if match is None:
                continue
            id_column = next(c for c, v in match.items() if v == linked)
            names = [c for c, v in match.items() if isinstance(v, str) and c != id_column]
            if not names:
                continue
            first = f"SELECT {column} FROM {table} WHERE {key} = {_literal(value)}"
            out.append(Query(first, "", self.source.get(f"{table}.rows")))
            out.append(
                Query(
                    f"SELECT {names[0]} FROM {other} WHERE {id_column} = {_literal(linked)}",
                    f"What is the {_words(names[0])} of the {_singular(other)} of the "
                    f"{_singular(table)} whose {_words(key)} is {value}?",
                    self.source.get(f"{table}.rows"),
                    first,
                )
            )
        return out


def _words(column: str) -> str:
    return column.replace("_", " ").lower()


def _is_key(column: str, table: str) -> bool:
    lowered = column.lower()
    return lowered == "id" or lowered.endswith("_id") or lowered == f"{_singular(table)}id"


def _linked_table(column: str, tables: dict[str, dict[str, str]]) -> str | None:
    """The table a `<thing>_id` column points at (`author_id` -> `authors`)."""
    if not column.lower().endswith("_id"):
        return None
    stem = column[:-3].lower()
    for table in tables:
        if _singular(table) == stem or table.lower() == stem:
            return table
    return None
