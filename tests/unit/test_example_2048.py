"""2048 example (examples/game_2048/env.py): merge rules, moves, spawns, greedy yardstick."""

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from game_2048.env import (
    Episode,
    Start,
    greedy_score,
    legal_moves,
    parse_direction,
    reward,
    slide,
    slide_row,
    spawn,
)


@pytest.mark.parametrize(
    "row,expected,score",
    [
        ((2, 2, 2, 2), (4, 4, 0, 0), 8),  # two merges, each pair once
        ((2, 2, 4, 0), (4, 4, 0, 0), 4),  # a merged tile does not merge again
        ((4, 4, 8, 0), (8, 8, 0, 0), 8),
        ((0, 2, 0, 2), (4, 0, 0, 0), 4),  # slides across gaps before merging
        ((2, 4, 2, 4), (2, 4, 2, 4), 0),  # nothing to merge
        ((8, 0, 0, 8), (16, 0, 0, 0), 16),
        ((2, 2, 2, 0), (4, 2, 0, 0), 4),  # the leading pair merges first
    ],
)
def test_slide_row_merge_rules(row, expected, score):
    assert slide_row(row) == (expected, score)


def test_slide_in_each_direction():
    grid = ((2, 0, 2, 0), (0, 0, 0, 0), (2, 0, 0, 0), (4, 0, 0, 4))
    assert slide(grid, "left") == (((4, 0, 0, 0), (0, 0, 0, 0), (2, 0, 0, 0), (8, 0, 0, 0)), 12)
    assert slide(grid, "right") == (((0, 0, 0, 4), (0, 0, 0, 0), (0, 0, 0, 2), (0, 0, 0, 8)), 12)
    assert slide(grid, "up") == (((4, 0, 2, 4), (4, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0)), 4)
    assert slide(grid, "down") == (((0, 0, 0, 0), (0, 0, 0, 0), (4, 0, 0, 0), (4, 0, 2, 4)), 4)
    with pytest.raises(ValueError, match="not one of"):
        slide(grid, "north")


def test_legal_moves_are_those_that_change_the_board():
    assert legal_moves(((2, 4), (4, 2))) == []
    assert legal_moves(((2, 0), (0, 0))) == ["right", "down"]
    assert sorted(legal_moves(((2, 2), (4, 8)))) == ["left", "right"]


def test_spawn_fills_one_empty_cell_with_a_2_or_4():
    grid = ((2, 0), (0, 4))
    for seed in range(20):
        after = spawn(grid, random.Random(seed))
        changed = [
            (a, b)
            for ra, rb in zip(grid, after, strict=True)
            for a, b in zip(ra, rb, strict=True)
            if a != b
        ]
        assert len(changed) == 1 and changed[0][0] == 0 and changed[0][1] in (2, 4)
    assert spawn(((2, 4), (8, 16)), random.Random(0)) == ((2, 4), (8, 16))


def test_episodes_are_reproducible_and_noop_moves_spawn_nothing():
    start = Start(5)
    assert start.board() == Start(5).board() != Start(6).board()
    a, b = Episode(start), Episode(start)
    for direction in ("left", "up", "right"):
        a.play(direction)
        b.play(direction)
    assert a.grid == b.grid and a.score == b.score
    stuck = Episode(start)
    stuck.grid = ((2, 4, 0, 0), (8, 16, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0))
    before = stuck.grid
    assert stuck.play("left") is False and stuck.play("up") is False  # nothing moves
    assert stuck.grid == before and stuck.valid == 0 and stuck.turns == 2
    assert stuck.play(None) is False and stuck.turns == 3
    assert stuck.play("right") is True and stuck.valid == 1
    assert sum(v > 0 for row in stuck.grid for v in row) == 5  # four slid, one spawned


def test_greedy_yardstick_takes_the_largest_merge():
    episode = Episode(Start(3))
    best = max(legal_moves(episode.grid), key=lambda d: slide(episode.grid, d)[1])
    first_merge = slide(episode.grid, best)[1]
    assert greedy_score(Start(3), 1) == first_merge
    assert greedy_score(Start(3), 5) >= first_merge


def test_parse_direction_and_reward_tiers():
    assert parse_direction("Left.") == "left" and parse_direction("I go up then down") == "up"
    assert parse_direction("leftwards") is None and parse_direction(None) is None
    assert reward(0, 0, 16, 5) == 0.0
    assert reward(5, 0, 16, 5) == pytest.approx(0.3)  # valid moves, no merges
    assert reward(5, 8, 16, 5) == pytest.approx(0.65)
    assert reward(5, 32, 16, 5) == pytest.approx(1.0)  # beating greedy is capped at 1
    assert reward(2, 16, 16, 5) == pytest.approx(0.82)
