"""Temporal Clue example (examples/temporal_clue/puzzles.py): solver, generator, credit."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from temporal_clue.puzzles import Clue, make_puzzle, parse_answer, score, solve

TIMES = ("8 pm", "9 pm", "10 pm")


def test_clue_semantics():
    c = ("Ann", "attic", "9 pm")
    assert not Clue("not_who", who="Ann").allows(c, TIMES)
    assert Clue("not_where", where="hall").allows(c, TIMES)
    assert Clue("before", when="10 pm").allows(c, TIMES)
    assert not Clue("after", when="9 pm").allows(c, TIMES)
    assert not Clue("at", who="Ann", where="hall", when="9 pm").allows(c, TIMES)
    assert Clue("at", who="Ann", where="hall", when="8 pm").allows(c, TIMES)
    assert Clue("at", who="Ben", where="hall", when="9 pm").allows(c, TIMES)
    assert not Clue("alone", who="Ben", where="attic", when="9 pm").allows(c, TIMES)
    assert Clue("alone", who="Ann", where="attic", when="9 pm").allows(c, TIMES)


def test_solver_enumerates_what_the_clues_allow():
    clues = [Clue("not_who", who="Ben"), Clue("before", when="9 pm")]
    found = solve(("Ann", "Ben"), ("attic", "hall"), TIMES, clues)
    assert found == [("Ann", "attic", "8 pm"), ("Ann", "hall", "8 pm")]
    clues.append(Clue("at", who="Ann", where="hall", when="8 pm"))
    assert solve(("Ann", "Ben"), ("attic", "hall"), TIMES, clues) == [("Ann", "hall", "8 pm")]


@pytest.mark.parametrize("size", [2, 3, 4])
def test_generated_puzzles_have_one_solution_true_clues_and_no_redundant_clue(size):
    for seed in range(40):
        p = make_puzzle(seed, size)
        assert solve(p.suspects, p.rooms, p.times, p.clues) == [p.solution]
        assert all(c.allows(p.solution, p.times) for c in p.clues)
        for clue in p.clues:
            rest = [c for c in p.clues if c != clue]
            assert len(solve(p.suspects, p.rooms, p.times, rest)) > 1
    assert make_puzzle(3) == make_puzzle(3) != make_puzzle(4)
    with pytest.raises(ValueError, match="2-5"):
        make_puzzle(0, size=9)


def test_puzzle_text_lists_every_clue():
    p = make_puzzle(11)
    text = p.text()
    assert all(c.text(p.times) in text for c in p.clues) and "Who did it" in text


def test_partial_credit_per_field():
    p = make_puzzle(1)
    who, where, when = p.solution
    wrong_who = next(s for s in p.suspects if s != who)
    assert score(parse_answer(f"Who: {who}\nWhere: {where}\nWhen: {when}", p), p) == 1.0
    assert score(
        parse_answer(f"Who: {wrong_who}\nWhere: the {where}\nWhen: {when}", p), p
    ) == pytest.approx(2 / 3)
    assert score(parse_answer(f"**Who:** {who}", p), p) == pytest.approx(1 / 3)
    assert score(parse_answer(f"I think {who} in the {where}", p), p) == 0.0  # no labels
    both = " or ".join(p.suspects[:2])
    assert parse_answer(f"Who: {both}", p)["who"] is None  # naming two is no answer
