"""Arguments for a tool from its schema alone, improved by what the server answers.

Exploring a server needs calls that work, and nobody wrote example arguments. For each
property, `ArgumentSynthesizer` builds a pool of candidate values, best first:

1. what the schema says: `const`, `enum` values, `examples`, `default`, values quoted
   or given after "e.g." in the description, and for numbers the `minimum`/`maximum`;
2. what the name and description say the value is (`NAMED`): a `timezone` gets IANA
   zone names, an `expression` arithmetic, a `time` described as HH:MM clock times, a
   `date` ISO dates, a `url` URLs, an `email` an address;
3. what the server has said so far (`observe`, `refuse`): string values found in earlier
   results (names, ids, paths — a listing feeds the lookup; values found under the
   property's own name first) and in error messages (an error often names what is
   valid), and paths in the server's own launch command;
4. guesses any server might know (`GUESSES`): a `query` gets common words, a `city`
   city names, a `pattern` globs; then a value shaped by the type and `format`.

A property that takes SQL (`chaining.is_sql_property`) gets SELECTs written from the
tables, columns and rows earlier answers showed (`chaining.DataModel`), each with the
question it answers. `provenance(tool, arguments)` says which earlier call supplied a
call's values (a listing's name, a query's row) and which question it answers: the
chains that multi-step scenarios are written from.

`candidates(name, schema, n)` combines the pools into `n` distinct argument sets (the
required properties, or the first one when none is required). A value the server
refused is never proposed again for that property of that tool (`refuse`).
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Callable
from typing import Any

from rlcoach.autorl.facts import keyed_line
from rlcoach.autorl.grounded import call_key
from rlcoach.integrations.mcp.chaining import DataModel, Query, is_sql_property, parse_result

__all__ = ["GUESSES", "NAMED", "ArgumentSynthesizer", "keyed_strings_in", "strings_in"]

_QUOTED = re.compile(r"""['"`]([^'"`\n]{1,80})['"`]""")
_EG = re.compile(r"(?:e\.g\.|for example|such as|like)[,:]?\s*([^'\"`\s,;)]+)", re.IGNORECASE)
_PATH = re.compile(r"(?:^|\s|['\"])(/[\w.\-/]+)")
_BARE_ITEM = re.compile(r"^\s+[\w.\-/]{1,80}\s*$")
_FILE_NAME = re.compile(r"[\w.\-]+(?:/[\w.\-]+)*/?")
_FILE_KEY = re.compile(r"[\w\-./]{1,80}\.[A-Za-z0-9]{1,5}")
_HEX_ID = re.compile(r"[0-9a-f]{7,40}")

ZONES = [
    "Europe/London", "Asia/Tokyo", "America/New_York", "Europe/Paris", "Australia/Sydney",
    "America/Los_Angeles", "Asia/Kolkata", "Europe/Berlin", "America/Sao_Paulo",
    "Africa/Cairo", "Asia/Singapore", "Europe/Madrid", "America/Chicago", "Asia/Dubai",
    "Europe/Moscow", "Pacific/Auckland", "America/Toronto", "Asia/Shanghai",
]  # fmt: skip
CLOCK = ["09:30", "14:00", "18:45", "07:15", "12:00", "21:30", "16:20", "08:05"]
DATES = ["2026-03-14", "2025-11-02", "2026-07-01", "2024-12-25", "2026-01-20"]
WORDS = ["python", "time", "report", "alice", "paris", "data", "music", "notes"]


def _expressions(rng: random.Random) -> list[str]:
    out = []
    for _ in range(12):
        a, b, c = rng.randint(2, 99), rng.randint(2, 40), rng.randint(2, 9)
        out.append(
            rng.choice(
                [f"{a} + {b}", f"{a} * {c}", f"{a} - {b}", f"({a} + {b}) * {c}",
                 f"{a * c} / {c}", f"{c} ** 3", f"{a} * {b} + {c}"]
            )
        )  # fmt: skip
    return out


def _needs(*words: str) -> Callable[[str], bool]:
    return lambda text: any(re.search(rf"\b{w}", text) for w in words)


NAMED: list[tuple[Callable[[str], bool], Callable[[random.Random], list[Any]]]] = [
    (_needs("timezone", "time_zone", "tz\\b", "zone"), lambda r: r.sample(ZONES, len(ZONES))),
    (_needs("expression", "formula", "equation", "expr\\b", "calculation"), _expressions),
    (_needs("hh:mm", "24-hour", "clock"), lambda r: r.sample(CLOCK, len(CLOCK))),
    (_needs("date", "day\\b", "yyyy"), lambda r: r.sample(DATES, len(DATES))),
    (_needs("url", "uri", "link", "website"), lambda r: ["https://example.com/"]),
    (_needs("email", "e-mail"), lambda r: ["ada@example.com"]),
]
"""(does a property's name and description match, values to try): kinds of values
whose shape matters more than what the server has said so far."""
GUESSES: list[tuple[Callable[[str], bool], Callable[[random.Random], list[Any]]]] = [
    (_needs("city", "location", "place"), lambda r: ["Paris", "Tokyo", "Lisbon", "Oslo"]),
    (_needs("country"), lambda r: ["France", "Japan", "Brazil"]),
    (_needs("lang"), lambda r: ["en", "fr"]),
    (_needs("pattern", "glob"), lambda r: ["*", "*.md", "*.txt", "**/*.md"]),
    (_needs("query", "search", "keyword", "term", "text", "q\\b"), lambda r: list(WORDS)),
]
"""The same, for values any server might know: tried after what this one returned."""


def strings_in(text: str) -> list[str]:
    """Short string values in a result or error message: JSON string leaves when it is
    JSON, else quoted strings and absolute paths."""
    return [value for _, value in keyed_strings_in(text)]


def keyed_strings_in(text: str) -> list[tuple[str, str]]:
    """(the JSON key it was found under, or "", value) for each of `strings_in`."""
    found: list[tuple[str, str]] = []
    parsed = parse_result(text) if isinstance(text, str) else None

    def walk(node: Any, key: str) -> None:
        if isinstance(node, str):
            if 0 < len(node) <= 80:
                found.append((key, node))
        elif isinstance(node, dict):
            for name, value in node.items():
                if _FILE_KEY.fullmatch(str(name)):  # {"sales.xlsx": 5668}: the name is a value
                    found.append((key, str(name)))
                walk(value, str(name))
        elif isinstance(node, list):
            for item in node:
                walk(item, key)

    if isinstance(parsed, dict | list):
        walk(parsed, "")
    else:
        found += [("", m.group(1)) for m in _QUOTED.finditer(text)]
        found += [("", m.group(1).rstrip(".,:;")) for m in _PATH.finditer(text)]
        lines = text.splitlines()
        for line in lines:
            # listings: "[FILE] notes.md", "- item", "* master", "1. item"
            item = re.sub(r"^\s*(?:\[\w+\]|[-*•]|\d+[.)])\s+", "", line).strip()
            if item and item != line.strip() and len(item) <= 80:
                found.append(("", item))
            # records: "Commit: 5ca6170...", "Author: Grace Hopper" (the key is kept)
            keyed = keyed_line(line)
            if keyed and len(keyed[1]) <= 80:
                found.append((keyed[0].lower().replace(" ", "_"), keyed[1]))
            # a bare name on its own indented line: a listing without markers
            if _BARE_ITEM.match(line) and len(lines) > 1:
                found.append(("", line.strip()))
    unique = dict.fromkeys((k, v.strip()) for k, v in found if v.strip())
    return list(unique)


_GENERIC_WORDS = frozenset(["name", "id", "get", "list", "read", "value", "key", "by", "of"])


def _stems(name: str) -> set[str]:
    """The words of a tool's or property's name, without a plural s."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name).lower()
    return {w.rstrip("s") for w in re.split(r"[^a-z0-9]+", spaced) if len(w) > 1}


def _kind(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind is None:
        for key in ("anyOf", "oneOf"):
            options = [o for o in schema.get(key, []) if o.get("type") != "null"]
            if options:
                return _kind(options[0])
        kind = "object" if "properties" in schema else "string"
    return str(kind)


def _fits(value: Any, schema: dict[str, Any]) -> bool:
    kind = _kind(schema)
    if kind in ("integer", "number"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if kind == "integer" and not float(value).is_integer():
            return False
        low, high = schema.get("minimum"), schema.get("maximum")
        return (low is None or value >= low) and (high is None or value <= high)
    if kind == "string":
        if not isinstance(value, str):
            return False
        return schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", 10**6)
    if kind == "boolean":
        return isinstance(value, bool)
    return True


class ArgumentSynthesizer:
    """Candidate arguments per tool (see the module docstring)."""

    def __init__(self, *, seed: int = 0, hints: list[str] = ()) -> None:
        self.rng = random.Random(seed)
        self.seen: list[str] = []
        """String values the server returned or named, most recent last."""
        self.keys: dict[str, str] = {}
        """The JSON key each value of `seen` was first found under."""
        self.learned: dict[str, list[Any]] = {}
        """Per property name: values an error message suggested."""
        self.refused: dict[str, list[Any]] = {}
        self.lessons: list[str] = []
        self.data = DataModel()
        """Tables, columns and rows learned from answers (for SQL properties)."""
        self.origin: dict[str, str] = {}
        """Per value of `seen`, the call (`grounded.call_key`) whose answer gave it."""
        self.queries: dict[str, Query] = {}
        """The SELECTs proposed so far, by their text."""
        self.first_calls: dict[str, str] = {}
        """Per two-step SELECT, the key of the call that runs its first step."""
        self.descriptions: dict[str, str] = {}
        """Per tool, its description (a property takes SQL when the tool says so)."""
        self.worked: dict[str, list[dict[str, Any]]] = {}
        """Per tool, the arguments of its calls that answered (newest last)."""
        self.worked_values: dict[str, list[Any]] = {}
        """Per property name, values that answered in some tool: the first guess for
        the same property of the others (a `repo_path` that worked once works again)."""
        for hint in hints:  # the launch command's arguments, e.g. the folder it serves
            self.seen += [m.group(1) for m in _PATH.finditer(" " + hint)]

    def observe(
        self,
        result: str,
        arguments: dict[str, Any] | None = None,
        *,
        tool: str = "",
        call: str = "",
        index: int | None = None,
    ) -> None:
        """Remember the string values of a result, for later calls; a relative name in
        the answer to a call given a folder is also remembered joined to that folder.
        `call` names the call (its key) and `index` its place among the calls that
        worked, so later calls that use its values know where they came from."""
        if index is not None:
            self.data.learn(tool, arguments or {}, result, index)
        if tool and arguments:
            self.worked.setdefault(tool, []).append(dict(arguments))
            for name, value in arguments.items():
                values = self.worked_values.setdefault(name, [])
                if isinstance(value, str | int | float | bool) and value not in values:
                    values.append(value)
        folders = [
            v.rstrip("/")
            for v in (arguments or {}).values()
            if isinstance(v, str) and v.startswith("/")
        ]
        for key, value in keyed_strings_in(result):
            # a relative file name joins the folder; a phrase ("git add") does not
            named = not value.startswith("/") and _FILE_NAME.fullmatch(value)
            joined = [f"{f}/{value}" for f in folders] if named else []
            for item in (*joined, value):
                if item not in self.seen:
                    self.seen.append(item)
                    self.keys[item] = key
                    if call:
                        self.origin.setdefault(item, call)

    def refuse(self, tool: str, arguments: dict[str, Any], error: str) -> str | None:
        """Learn from a refused call: its values are not proposed again for those
        properties, and values the error quotes are tried for the property it names
        (or every refused property). Returns what was learned, for the report."""
        proven = self.worked.get(tool, [])
        for name, value in arguments.items():
            # a value that answered in another call of this tool is not what was wrong
            if not any(call.get(name) == value for call in proven):
                self.refused.setdefault(f"{tool}.{name}", []).append(value)
        given = [str(v) for v in arguments.values() if v not in (None, "")]
        suggested = [
            s
            for s in [*strings_in(error), *(m.group(1).rstrip(".") for m in _EG.finditer(error))]
            # a value looks like one: short, few words, not the refused value quoted back
            if len(s) <= 40 and len(s.split()) <= 3 and not any(g in s for g in given)
        ]
        if not suggested:
            return None
        named = [n for n in arguments if re.search(rf"\b{re.escape(n)}\b", error)]
        for name in named or list(arguments):
            pool = self.learned.setdefault(name, [])
            pool += [s for s in suggested if s not in pool]
        for value in suggested:
            if value not in self.seen:
                self.seen.append(value)
        lesson = f"{tool}: the error suggested {', '.join(map(repr, suggested[:4]))}"
        self.lessons.append(lesson)
        return lesson

    def values(self, tool: str, name: str, schema: dict[str, Any], n: int) -> list[Any]:
        """Up to `n` distinct values for one property of `tool`, best first."""
        kind = _kind(schema)
        if kind == "object":
            return [self._object(tool, schema, i) for i in range(n)]
        if kind == "array":
            items = self.values(tool, name, schema.get("items") or {"type": "string"}, n + 1)
            size = max(int(schema.get("minItems", 1)), 1)
            return [items[i : i + size] or items[:size] for i in range(min(n, len(items)))] or [[]]
        pool: list[Any] = []
        if "const" in schema:
            return [schema["const"]]
        pool += schema.get("enum") or []
        pool += schema.get("examples") or []
        if "default" in schema and schema["default"] is not None:
            pool.append(schema["default"])
        # values that answered in other tools (this tool's own are varied from, in
        # `candidates`, not proposed again)
        own = [call.get(name) for call in self.worked.get(tool, [])]
        pool += [v for v in self.worked_values.get(name, []) if v not in own]
        pool += self.learned.get(name, [])
        description = str(schema.get("description", ""))
        text = f"{name.replace('_', ' ')} {name} {description}".lower()
        pool += [m.group(1) for m in _QUOTED.finditer(description)]
        pool += [m.group(1).rstrip(".") for m in _EG.finditer(description)]
        if kind in ("integer", "number"):
            low = schema.get("minimum", schema.get("exclusiveMinimum", 0) + 1)
            high = schema.get("maximum", max(low, 1) + 9)
            pool += [
                low,
                high,
                *self.rng.sample(range(int(low), int(high) + 1), min(4, int(high - low) + 1)),
            ]
            pool = [int(v) if kind == "integer" and isinstance(v, float) else v for v in pool]
        elif kind == "boolean":
            pool += [False, True]
        elif is_sql_property(name, schema, self.descriptions.get(tool, "")):
            for query in self.data.queries():
                self.queries.setdefault(query.sql, query)
                if query.first:
                    self.first_calls[query.sql] = call_key(tool, {name: query.first})
                pool.append(query.sql)
        else:
            for matches, make in NAMED:
                if matches(text):
                    pool += make(self.rng)
            pool += self._seen_for(name, text)
            for matches, make in GUESSES:
                if matches(text):
                    pool += make(self.rng)
            pool += self._formatted(schema, name)
        refused = self.refused.get(f"{tool}.{name}", [])
        out: list[Any] = []
        for value in pool:
            if value in refused or value in out or not _fits(value, schema):
                continue
            out.append(value)
            if len(out) >= n:
                break
        return out or [self._formatted(schema, name)[0]]

    def _seen_for(self, name: str, text: str) -> list[str]:
        """Values the server returned that suit the property: paths for a path, ids for
        an id, short names for a name or query, anything short otherwise; first those it
        returned under the property's own name (`name` for `names`, `id` for `item_id`)."""
        stem = name.lower().rstrip("s").split("_")[-1]
        words = _stems(name) - _GENERIC_WORDS

        def rank(value: str) -> tuple[bool, bool]:
            # first values from a tool about the same thing (`list_tables` for a
            # `table_name`), then values found under the property's own name
            tool = self.origin.get(value, "").split(":", 1)[0]
            same_topic = bool(words & _stems(tool))
            return (
                not same_topic,
                self.keys.get(value, "").lower().rstrip("s").split("_")[-1] != stem,
            )

        recent = sorted(reversed(self.seen), key=rank)
        if re.search(r"\b(revision|rev|commit|sha|ref|refspec|target|branch|tag)\b", text):
            # a version-control object: ids the server showed, names it listed
            ids = [v for v in recent if _HEX_ID.fullmatch(v)]
            names = [v for v in recent if re.fullmatch(r"[\w.\-/]{1,60}", v) and "/" not in v[:1]]
            return [*ids, *[v for v in names if v not in ids]]
        if re.search(r"\b(path|file|dir|directory|folder|root|repo)", text):
            return [v for v in recent if ("/" in v or "." in v) and not re.search(r"\s", v)]
        if re.search(r"\b(id|ids|key|sku|uuid|identifier)\b|_id\b", text):
            return [v for v in recent if re.fullmatch(r"[\w.:-]{1,40}", v)]
        return [v for v in recent if len(v) <= 40 and "\n" not in v]

    def _formatted(self, schema: dict[str, Any], name: str) -> list[Any]:
        fmt = schema.get("format", "")
        if fmt == "email":
            return ["ada@example.com"]
        if fmt in ("uri", "url"):
            return ["https://example.com/"]
        if fmt == "date":
            return list(DATES)
        if fmt == "date-time":
            return [f"{d}T12:00:00Z" for d in DATES]
        if fmt == "uuid":
            return ["123e4567-e89b-12d3-a456-426614174000"]
        return [name.replace("_", " ") or "example"]

    def _object(self, tool: str, schema: dict[str, Any], index: int) -> dict[str, Any]:
        properties = schema.get("properties", {})
        names = schema.get("required") or list(properties)[:1]
        out = {}
        for name in names:
            if name in properties:
                values = self.values(tool, name, properties[name], index + 1)
                out[name] = values[min(index, len(values) - 1)]
        return out

    def provenance(self, arguments: dict[str, Any]) -> tuple[str, str | None]:
        """(the question a SELECT among `arguments` answers, or "", the key of the earlier
        call whose answer supplied a value of `arguments`, or None)."""
        for value in arguments.values():
            query = self.queries.get(value) if isinstance(value, str) else None
            if query is not None:
                return query.question, self.first_calls.get(value)
        for value in arguments.values():
            if isinstance(value, str) and value in self.origin:
                return "", self.origin[value]
        return "", None

    def candidates(
        self, tool: str, schema: dict[str, Any], n: int, *, description: str = ""
    ) -> list[dict[str, Any]]:
        """Up to `n` distinct argument sets for `tool`, whose input schema is `schema`."""
        if description:
            self.descriptions[tool] = description
        properties = schema.get("properties", {})
        names = [p for p in (schema.get("required") or list(properties)[:1]) if p in properties]
        if not names:
            return [{}]
        pools = [self.values(tool, name, properties[name], n) for name in names]
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        # From the newest call that answered, one property changed at a time (a call
        # that then fails says which value was wrong), the last property first (the first
        # is often the scope: a repository, a database); then the pools walked together
        # (value i of each), then mixed, for variety in few calls.
        base = next(
            (c for c in reversed(self.worked.get(tool, [])) if all(k in c for k in names)), None
        )
        varied = (
            (
                tuple(value if j == i else base[other] for j, other in enumerate(names))
                for i, pool in reversed(list(enumerate(pools)))
                for value in pool
            )
            if base is not None and len(names) > 1
            else ()
        )
        combos = itertools.chain(
            varied,
            (tuple(pool[i % len(pool)] for pool in pools) for i in range(n)),
            itertools.product(*pools),
        )
        for combo in combos:
            arguments = dict(zip(names, combo, strict=True))
            key = json.dumps(arguments, sort_keys=True, default=str)
            if key in seen:
                continue
            seen.add(key)
            out.append(arguments)
            if len(out) >= n:
                break
        return out
