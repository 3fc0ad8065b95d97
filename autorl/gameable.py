"""Answer keys that cannot be gamed: facts that distinguish, and the trivial-reply check.

A grounded scenario is scored by the key facts its final answer states (`facts.py`). If
those facts are values almost any reply contains — the `0` and `1` of a column listing,
a type name every table shares — a policy earns the reward without the tool, and the
held-out success says nothing. Two guards:

- `common_facts(calls)`: facts that do not distinguish one answer of a tool from its
  others — found in more than half of that tool's answers (when it gave three or more) —
  are never chosen as key facts.
- `drop_gameable(records)`: each scenario is scored, with the reward a reply without any
  tool call gets (0.6 times the fraction of its facts stated), on trivial replies: an empty
  one, the question repeated, a generic answer (`GENERIC`), and the correct answer of
  every other scenario written from another call (unless this scenario's answer states
  it too: two tools that return the same item answer each other's questions rightly;
  for a question about one record's field, unless the other task's result is about the
  same record: "TEXT" must not answer every column-type question).
  A fact one of them states is taken out of the key; a scenario is kept only if a fact
  remains, so that every trivial reply scores below `GAMEABLE_AT` (0.2); the rest are
  returned with the reply that beat them, for the report and the error that says why
  nothing was kept.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from rlcoach.autorl.facts import Fact, fact_found, facts_score, key_facts, parsed
from rlcoach.autorl.types import InputRecord

if TYPE_CHECKING:
    from rlcoach.autorl.grounded import GroundedCall

__all__ = ["GAMEABLE_AT", "GENERIC", "Gamed", "common_facts", "drop_gameable", "trivial_score"]

GAMEABLE_AT = 0.2
"""A trivial reply scoring this much or more makes a scenario gameable."""
GENERIC = (
    "I don't know. It could be 0 or 1, yes or no, true or false, none, null or empty; "
    "I could not find it."
)
"""A reply that says nothing about the data but the values every data set has."""
_FACT_SHARE = 0.6
"""The grounded check's weight on the facts: what a reply without a tool call can earn."""


class Gamed(NamedTuple):
    """A scenario a trivial reply scored on."""

    record: InputRecord
    reply: str
    score: float


def _facts(record: InputRecord) -> list[Fact]:
    raw = record.metadata.get("facts")
    return [Fact(*item) for item in json.loads(raw)] if isinstance(raw, str) else []


def common_facts(calls: Sequence[GroundedCall]) -> dict[tuple[str, str, str], float]:
    """Per (tool, kind, normal value), the share of the tool's answers that state it: a
    fact in more than half of them (of three or more) does not distinguish, and among
    the rest the rarer say more; under the tool `"*"`, the share of all the answers."""
    per_tool: dict[str, list[set[tuple[str, str]]]] = {}
    for call in calls:
        facts = key_facts(call.result, limit=64)
        per_tool.setdefault(call.tool, []).append({(f.kind, f.normal()) for f in facts})
    shares: dict[tuple[str, str, str], float] = {}
    every = [answer for answers in per_tool.values() for answer in answers]
    overall = Counter(fact for answer in every for fact in answer)
    for fact, count in overall.items():  # under "*": the share of all the calls' answers
        shares[("*", *fact)] = count / max(len(every), 3)
    for tool, answers in per_tool.items():
        counts = Counter(fact for answer in answers for fact in answer)
        for fact, count in counts.items():
            # with fewer than three answers nothing is common yet: rank, never drop
            share = count / len(answers) if len(answers) >= 3 else count / (len(answers) + 2)
            shares[(tool, *fact)] = share
    return shares


def _all_in(facts: list[Fact], text: str) -> bool:
    return bool(text) and all(fact_found(f, text) for f in facts)


def _mentions(result: str, value: str) -> bool:
    """Whether a result names `value` as a value (a JSON leaf, else a word-bounded run of
    its text): a column named "name" is not the JSON key `name`."""
    data = parsed(result)
    if isinstance(data, dict | list):
        leaves: list[str] = []

        def walk(node: object) -> None:
            if isinstance(node, dict):
                for item in node.values():
                    walk(item)
            elif isinstance(node, list):
                for item in node:
                    walk(item)
            elif node is not None:
                leaves.append(str(node))

        walk(data)
        return value in leaves
    return re.search(rf"(?<!\w){re.escape(value)}(?!\w)", result) is not None


def trivial_score(record: InputRecord, reply: str) -> float:
    """The reward a reply without a tool call gets on `record`."""
    return round(_FACT_SHARE * facts_score(_facts(record), reply), 6)


def drop_gameable(records: Sequence[InputRecord]) -> tuple[list[InputRecord], list[Gamed]]:
    """(kept, gamed): see the module docstring."""
    answers = []
    seen: set[tuple[str, str]] = set()
    for r in records:
        if facts := _facts(r):
            pair = (
                str(r.metadata.get("call") or r.id),
                "The answer: " + "; ".join(f.display() for f in facts),
            )
            if pair not in seen:
                seen.add(pair)
                answers.append((*pair, facts, str(r.metadata.get("answer_key") or "")))
    kept, gamed = [], []
    for record in records:
        call = str(record.metadata.get("call") or record.id)
        key = str(record.metadata.get("answer_key") or "")
        about = str(record.metadata.get("about") or "")
        # another task's answer is trivial here unless it is right here too: this answer
        # states it (two tools that return the same item answer each other's questions),
        # or, for a question about one record, the other task's result is about the same
        # record (a commit's `git_show` and the log's line on it); "TEXT" answers no
        # column-type question but its own
        others = [
            a
            for c, a, facts, result in answers
            if c != call and not (_mentions(result, about) if about else _all_in(facts, key))
        ]
        trivial = ["", record.text, GENERIC, *others]
        facts = _facts(record)
        # a fact some trivial reply states is no part of the key; the rest must remain
        left = [f for f in facts if not any(fact_found(f, reply) for reply in trivial)]
        if left and len(left) < len(facts):
            note = json.dumps([[f.kind, f.value, f.shown] for f in left])
            record = record.model_copy(update={"metadata": {**record.metadata, "facts": note}})
        worst = max(trivial, key=lambda reply: trivial_score(record, reply))
        score = trivial_score(record, worst) if left else _FACT_SHARE
        if score >= GAMEABLE_AT:
            gamed.append(Gamed(record, worst, score))
        else:
            kept.append(record)
    return kept, gamed
