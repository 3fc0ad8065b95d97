"""Key facts of a tool's result, and whether an answer carries them.

A grounded scenario's answer key is the real result of a call; a reward that compares
whole texts would fail every paraphrase, and a judge is not always at hand. So the key
is reduced to a few facts a correct answer must state: numbers, names and times found in
the result. `key_facts(result)` reads a JSON result leaf by leaf and a plain-text one by
pattern; values the request itself contains are left out (`known`): repeating the
question proves nothing. At most `limit` facts are kept: times first, then numbers,
dates and names (the first say most about a result), each kind in the result's order.

`fact_found(fact, answer)` compares normalised forms: numbers by value (`19.0` is `19`,
`1,234` is `1234`), times by their hour and minute (`2026-12-05T22:21:33+09:00` is found
in "22:21 on 2026-12-05" as two facts, the date and the time), names and other text
case-, accent- and punctuation-insensitively as whole words.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rlcoach.autorl.dedupe import normalize_text

__all__ = ["Fact", "fact_found", "facts_score", "key_facts", "listed_items", "parsed"]

_ISO = re.compile(
    r"\b(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}:\d{2})(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?\b"
)
_CLOCK = re.compile(r"\b([01]?\d|2[0-3]):([0-5]\d)\b")
_NUMBER = re.compile(
    r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])"
)
_NAME = re.compile(r"\b[A-Z][\w'-]*(?:[ \t]+[A-Z][\w'-]*)*")
_MAX_TEXT_FACT = 60
_COMMON = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "can",
        "do",
        "for",
        "from",
        "he",
        "her",
        "his",
        "how",
        "i",
        "if",
        "in",
        "is",
        "it",
        "its",
        "my",
        "no",
        "not",
        "of",
        "on",
        "or",
        "our",
        "she",
        "so",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "use",
        "was",
        "we",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "you",
        "your",
    ]
)
"""Words that start sentences: capitalised, but no name."""
_PRIORITY = {"time": 0, "number": 1, "date": 2, "text": 3}
_KEYED = re.compile(r"^\s*([A-Za-z][A-Za-z _]{0,20}):\s+(\S.{0,119}?)\s*$")
_MARKER = re.compile(r"^\s*(?:\[\w+\]|[-*•]|\d+[.)])\s+")
_DAY_TIME = re.compile(r"(?<!\d)(\d{1,2}):(\d{2})(?!\d)")


@dataclass(frozen=True, slots=True)
class Fact:
    """One thing a correct answer must state."""

    kind: str
    """`number`, `date`, `time` or `text`."""
    value: str
    """The fact itself: `42`, `2026-12-05`, `22:21`, `Ada Lovelace`."""
    shown: str = ""
    """The string of the result it came from (a whole datetime for its date and time):
    what a worked example's answer repeats. Defaults to `value`."""

    def display(self) -> str:
        return self.shown or self.value

    def normal(self) -> str:
        return _normal_number(self.value) if self.kind == "number" else normalize_text(self.value)


def _normal_number(text: str) -> str:
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return normalize_text(text)
    if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


def _string_facts(text: str) -> list[Fact]:
    """Facts of one short string value: a datetime splits into its date and time."""
    found = _ISO.search(text)
    if found and found.group(0) == text.strip()[: len(found.group(0))]:
        shown = text.strip() if len(text) <= _MAX_TEXT_FACT else found.group(0)
        facts = [Fact("date", found.group(1), shown)]
        return [*facts, Fact("time", found.group(2), shown)] if found.group(2) else facts
    if _NUMBER.fullmatch(text.strip()):
        return [Fact("number", text.strip())]
    if len(text) <= _MAX_TEXT_FACT and text.strip():
        return [Fact("text", text.strip())]
    return _text_facts(text)


def _text_facts(text: str) -> list[Fact]:
    """Facts of free text: dates and times, then numbers, then capitalised names."""
    facts: list[Fact] = []
    spans: list[tuple[int, int]] = []
    for match in _ISO.finditer(text):
        facts.append(Fact("date", match.group(1), match.group(0)))
        if match.group(2):
            facts.append(Fact("time", match.group(2), match.group(0)))
        spans.append(match.span())
    for match in _CLOCK.finditer(text):
        if not any(a <= match.start() < b for a, b in spans):
            facts.append(Fact("time", f"{int(match.group(1)):02d}:{match.group(2)}"))
            spans.append(match.span())
    for match in _NUMBER.finditer(text):
        if not any(a <= match.start() < b for a, b in spans):
            facts.append(Fact("number", match.group(0)))
    for match in _NAME.finditer(text):
        name = match.group(0)
        if len(name) > 2 and (" " in name or name.lower() not in _COMMON):
            facts.append(Fact("text", name))
    return facts


def _json_facts(value: Any, key: str = "") -> list[Fact]:
    if isinstance(value, bool) or value is None:
        return []  # true/false/null: an answer rarely says them in a checkable way
    if isinstance(value, int | float):
        return [Fact("number", json.dumps(value))]
    if isinstance(value, str):
        return _string_facts(value)
    if isinstance(value, dict):
        return [f for k, v in value.items() for f in _json_facts(v, str(k))]
    if isinstance(value, list):
        positional = _positional_keys(value)
        if positional:  # a row's place in the list says nothing about the data
            value = [{k: v for k, v in row.items() if k not in positional} for row in value]
        return [f for item in value for f in _json_facts(item, key)]
    return []


def _positional_keys(rows: list[Any]) -> set[str]:
    """Keys of a list of objects whose values count the rows (0, 1, 2, ... or 1, 2, 3,
    ...): a column listing's `cid`, a row number."""
    if len(rows) < 2 or not all(isinstance(r, dict) for r in rows):
        return set()
    keys = set.intersection(*(set(r) for r in rows))
    out = set()
    for key in keys:
        values = [r[key] for r in rows]
        integers = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
        if (
            integers
            and values[0] in (0, 1)
            and values == list(range(values[0], len(rows) + values[0]))
        ):
            out.add(key)
    return out


def parsed(text: str) -> Any:
    """A result as data: JSON, or a Python literal (servers that answer `str(rows)`),
    else the text itself."""
    text = text.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    if text[:1] in "[{":
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            pass
        values = _json_values(text)  # one JSON value per content block, joined
        if values is not None:
            return values
    return text


def _json_values(text: str) -> list[Any] | None:
    """Several JSON values one after another (`{...}\n{...}`), or None."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while at < len(text):
        try:
            value, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return None
        values.append(value)
        while at < len(text) and text[at].isspace():
            at += 1
    return values if len(values) > 1 else None


def listed_items(result: str) -> list[list[str]]:
    """The items a listing names, in order, each as its string values: a list's strings,
    an object's string values (a row: its sku, its name, ...), else the lines of a text
    listing without their markers (`[FILE] notes.md`, `- item`)."""
    data = parsed(result)
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        data = lists[0] if len(lists) == 1 else data
    if isinstance(data, list):
        out = []
        for item in data:
            if isinstance(item, dict):
                out.append([str(v) for v in item.values() if isinstance(v, str | int)])
            elif isinstance(item, str | int):
                out.append([str(item)])
        return out
    records = keyed_records(result)
    if records:  # text records ("Commit: ...\nAuthor: ..."): one item each, its values
        return [list(record.values()) for record in records]
    lines = [_MARKER.sub("", line).strip() for line in result.splitlines()]
    return [[line] for line in lines if line and len(line) <= 80]


def keyed_line(line: str) -> tuple[str, str] | None:
    """(key, value) of a `Key: value` line ("Author: Grace Hopper"), else None."""
    found = _KEYED.match(line)
    return (found.group(1).strip(), found.group(2).strip()) if found else None


def keyed_records(result: str) -> list[dict[str, str]]:
    """The records of a listing with named fields, in order: a JSON list of objects (its
    rows' string and number values), or text records separated by blank lines whose
    lines read `Key: value` ("Commit: 5ca6...", "Author: Grace Hopper"). Empty when the
    answer is not such a listing."""
    data = parsed(result)
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        data = lists[0] if len(lists) == 1 else None
    if isinstance(data, list) and len(data) >= 3 and all(isinstance(r, list) for r in data):
        # a grid whose first row names the columns (a spreadsheet range)
        header, *rows = data
        if all(isinstance(h, str) and h.strip() for h in header) and len(set(header)) == len(
            header
        ):
            return [
                {h: str(v) for h, v in zip(header, row, strict=False) if v is not None}
                for row in rows
                if len(row) == len(header)
            ]
        return []
    if isinstance(data, list):
        return [
            {str(k): str(v) for k, v in row.items() if isinstance(v, str | int | float)}
            for row in data
            if isinstance(row, dict)
        ]
    blocks = []
    for block in re.split(r"\n\s*\n", result.strip()):
        fields = {}
        for line in block.splitlines():
            keyed = keyed_line(line)
            if keyed:
                fields[keyed[0]] = keyed[1]
        if fields:
            blocks.append(fields)
    # the records are the blocks with the most common set of fields ("Result: 4 rows"
    # after them is not one)
    shapes = Counter(frozenset(b) for b in blocks)
    shape, count = shapes.most_common(1)[0] if shapes else (frozenset(), 0)
    return [b for b in blocks if frozenset(b) == shape] if count >= 2 else []


def key_facts(result: str, *, known: str = "", limit: int = 3) -> list[Fact]:
    """Up to `limit` facts of a tool's result that `known` (the request) does not state."""
    text = result.strip()
    data = parsed(text)
    if isinstance(data, dict | list):
        candidates = _json_facts(data)  # an empty listing has no facts
    else:
        candidates = _text_facts(text) or (_string_facts(text) if text else [])
    facts: list[Fact] = []
    seen: set[tuple[str, str]] = set()
    # A time or a number says most about a result; then dates, then names.
    candidates.sort(key=lambda f: _PRIORITY.get(f.kind, 9))
    for fact in candidates:
        marker = (fact.kind, fact.normal())
        if not marker[1] or marker in seen or fact_found(fact, known):
            continue
        seen.add(marker)
        facts.append(fact)
        if len(facts) >= limit:
            break
    return facts


def _numbers(text: str) -> set[str]:
    return {_normal_number(m.group(0)) for m in _NUMBER.finditer(text)}


def fact_found(fact: Fact, answer: str) -> bool:
    """Whether `answer` states `fact` (see the module docstring)."""
    if not answer:
        return False
    if fact.kind == "number":
        return fact.normal() in _numbers(answer)
    if fact.kind == "time":
        hour, minute = fact.value.split(":")[:2]
        return any(int(h) == int(hour) and m == minute for h, m in _DAY_TIME.findall(answer))
    if fact.kind == "date":
        return re.search(rf"(?<!\d){re.escape(fact.value)}(?!\d)", answer) is not None
    wanted = fact.normal()
    return bool(wanted) and f" {wanted} " in f" {normalize_text(answer)} "


def facts_score(facts: list[Fact], answer: str | None) -> float:
    """The fraction of `facts` that `answer` states (1.0 when there are none)."""
    if not facts:
        return 1.0
    if not answer:
        return 0.0
    return sum(fact_found(f, answer) for f in facts) / len(facts)
