"""Temporal Clue style puzzles: who, where and when, from clues about a timeline.

Something was stolen; the culprit was in the crime room at the crime time. Every suspect
moved between rooms during the evening (a seeded timeline), and the clues are true facts
about that timeline and the crime:

- `not_who` / `not_where`: "It was not Ben." / "It did not happen in the attic."
- `before` / `after`: "It happened before 11 pm."
- `at`: "At 10 pm, Ann was in the garden." — so Ann at 10 pm means the garden;
- `alone`: "At 9 pm, only Cal was in the study." — so the study at 9 pm means Cal.

`make_puzzle` draws a solution and a timeline through it, then adds clues in a seeded
order until the brute-force solver (`solve`: every who x where x when) leaves exactly the
solution, and drops clues that turn out redundant. The reward gives partial credit,
a third per field answered right (`Who:`, `Where:`, `When:` lines), so a small model's
guesses already differ within a group and GRPO has something to compare.
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass

NAMES = ("Ann", "Ben", "Cal", "Dora", "Eli", "Fay", "Gus", "Hana")
ROOMS = ("kitchen", "library", "garden", "study", "attic", "cellar", "hall", "pantry")
TIMES = ("8 pm", "9 pm", "10 pm", "11 pm", "midnight")
ITEMS = ("the silver key", "a painting", "the cake", "a golden watch", "the old map")
FIELDS = ("who", "where", "when")

Candidate = tuple[str, str, str]  # (who, where, when)


@dataclass(frozen=True, slots=True)
class Clue:
    kind: str
    who: str = ""
    where: str = ""
    when: str = ""

    def text(self, times: tuple[str, ...]) -> str:
        return {
            "not_who": f"It was not {self.who}.",
            "not_where": f"It did not happen in the {self.where}.",
            "before": f"It happened before {self.when}.",
            "after": f"It happened after {self.when}.",
            "at": f"At {self.when}, {self.who} was in the {self.where}.",
            "alone": f"At {self.when}, only {self.who} was in the {self.where}.",
        }[self.kind]

    def allows(self, candidate: Candidate, times: tuple[str, ...]) -> bool:
        who, where, when = candidate
        if self.kind == "not_who":
            return who != self.who
        if self.kind == "not_where":
            return where != self.where
        if self.kind == "before":
            return times.index(when) < times.index(self.when)
        if self.kind == "after":
            return times.index(when) > times.index(self.when)
        if self.kind == "at":  # the culprit was where the timeline puts them
            return not (who == self.who and when == self.when and where != self.where)
        if self.kind == "alone":  # that room at that time held no one else
            return not (where == self.where and when == self.when and who != self.who)
        raise ValueError(f"clue kind {self.kind!r} is unknown")


@dataclass(frozen=True, slots=True)
class Puzzle:
    seed: int
    item: str
    suspects: tuple[str, ...]
    rooms: tuple[str, ...]
    times: tuple[str, ...]
    clues: tuple[Clue, ...]
    solution: Candidate

    def text(self) -> str:
        clues = "\n".join(f"{i}. {c.text(self.times)}" for i, c in enumerate(self.clues, 1))
        return (
            f"Someone took {self.item}. The thief was in that room at that time.\n"
            f"Suspects: {', '.join(self.suspects)}. Rooms: {', '.join(self.rooms)}. "
            f"Times: {', '.join(self.times)}.\nClues:\n{clues}\n"
            "Who did it, where and when?"
        )


def solve(suspects, rooms, times, clues) -> list[Candidate]:
    """Every (who, where, when) that all the clues allow."""
    return [
        c
        for c in itertools.product(suspects, rooms, times)
        if all(clue.allows(c, tuple(times)) for clue in clues)
    ]


def _true_clues(
    solution: Candidate, timeline: dict[tuple[str, str], str], suspects, rooms, times
) -> list[Clue]:
    who, where, when = solution
    pool = [Clue("not_who", who=s) for s in suspects if s != who]
    pool += [Clue("not_where", where=r) for r in rooms if r != where]
    pool += [Clue("before", when=t) for t in times if times.index(t) > times.index(when)]
    pool += [Clue("after", when=t) for t in times if times.index(t) < times.index(when)]
    pool += [Clue("at", who=s, where=timeline[s, t], when=t) for s in suspects for t in times]
    for t in times:
        for r in rooms:
            present = [s for s in suspects if timeline[s, t] == r]
            if len(present) == 1:
                pool.append(Clue("alone", who=present[0], where=r, when=t))
    return pool


def make_puzzle(seed: int, size: int = 3) -> Puzzle:
    """A puzzle with a unique solution, a pure function of (seed, size)."""
    if not 2 <= size <= 5:
        raise ValueError(f"puzzle size {size} must be 2-5 (suspects, rooms and times each)")
    rng = random.Random(f"temporal-clue-{seed}-{size}")
    suspects = tuple(rng.sample(NAMES, size))
    rooms = tuple(rng.sample(ROOMS, size))
    start = rng.randrange(len(TIMES) - size + 1)
    times = TIMES[start : start + size]
    solution = (rng.choice(suspects), rng.choice(rooms), rng.choice(times))
    timeline = {(s, t): rng.choice(rooms) for s in suspects for t in times}
    timeline[solution[0], solution[2]] = solution[1]
    pool = _true_clues(solution, timeline, suspects, rooms, times)
    rng.shuffle(pool)
    clues: list[Clue] = []
    for clue in pool:
        clues.append(clue)
        if len(solve(suspects, rooms, times, clues)) == 1:
            break
    for clue in list(clues):  # drop what the others already imply
        rest = [c for c in clues if c != clue]
        if len(solve(suspects, rooms, times, rest)) == 1:
            clues = rest
    assert solve(suspects, rooms, times, clues) == [solution]  # the pool always suffices
    return Puzzle(seed, rng.choice(ITEMS), suspects, rooms, times, tuple(clues), solution)


def parse_answer(text: str | None, puzzle: Puzzle) -> dict[str, str | None]:
    """The option named on each `Who:` / `Where:` / `When:` line (None: none or several)."""
    options = {"who": puzzle.suspects, "where": puzzle.rooms, "when": puzzle.times}
    answer: dict[str, str | None] = dict.fromkeys(FIELDS)
    for line in (text or "").splitlines():
        found = re.match(r"\s*\**\s*(who|where|when)\s*\**\s*:(.*)", line, re.IGNORECASE)
        if not found:
            continue
        field, value = found.group(1).lower(), found.group(2).lower()
        named = [o for o in options[field] if re.search(rf"\b{re.escape(o.lower())}\b", value)]
        if answer[field] is None and len(named) == 1:
            answer[field] = named[0]
    return answer


def score(answer: dict[str, str | None], puzzle: Puzzle) -> float:
    """Partial credit: the fraction of the three fields answered right."""
    return sum(answer[f] == v for f, v in zip(FIELDS, puzzle.solution, strict=True)) / 3
