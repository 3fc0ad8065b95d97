"""Tic Tac Toe example (examples/tictactoe/env.py): legal moves, wins, the opponent, reward."""

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from tictactoe.env import Board, Game, IllegalMove, Match, opponent_move, parse_move, reward


def board(layout: str) -> Board:
    return Board([c if c in "XO" else " " for c in layout.replace("\n", "")])


def test_legal_moves_are_the_free_cells_and_taken_cells_are_refused():
    b = board("X.O......")
    assert b.legal_moves() == [2, 4, 5, 6, 7, 8, 9]
    with pytest.raises(IllegalMove, match="taken by O"):
        b.play(3, "X")
    with pytest.raises(IllegalMove, match="outside"):
        b.play(10, "X")
    b.play(5, "X")
    assert 5 not in b.legal_moves()


@pytest.mark.parametrize(
    "layout,winner",
    [
        ("XXXOO....", "X"),
        ("O..O.XO.X", "O"),
        ("X.O.XO..X", "X"),
        (".OX.XOX..", "X"),
        ("XOXXOOOXX", None),
        ("XX.OO....", None),
    ],
)
def test_win_detection_on_rows_columns_and_diagonals(layout, winner):
    assert board(layout).winner() == winner


def test_a_full_board_without_a_line_is_over_as_a_draw():
    b = board("XOXXOOOXX")
    assert b.winner() is None and b.over() and b.legal_moves() == []


def test_render_shows_free_cells_by_number():
    assert board("X...O....").render() == "X|2|3\n-+-+-\n4|O|6\n-+-+-\n7|8|9"


def test_blocking_opponent_wins_first_then_blocks():
    rng = random.Random(0)
    assert opponent_move(board("OO.XX.X.."), rng, "blocking") == 3  # its own win
    assert opponent_move(board("XX.O....."), rng, "blocking") == 3  # X's threat
    assert opponent_move(board("X........"), rng, "random") in range(2, 10)
    with pytest.raises(ValueError, match="unknown"):
        opponent_move(Board(), rng, "perfect")


def test_parse_move_reads_the_first_cell_number():
    assert parse_move("5") == 5
    assert parse_move("I play 7, then 3") == 7
    assert parse_move("zero 0") is None and parse_move(None) is None


def test_reward_tiers_order_win_draw_loss_above_any_illegal_game():
    assert reward("win", 3) == 1.0 > reward("draw", 5) == 0.6 > reward("loss", 4) == 0.3
    assert reward("illegal", 0) == 0.0 < reward("illegal", 2) == pytest.approx(0.1)
    assert reward("illegal", 9) == 0.2 < reward("loss", 3)


def test_a_match_is_reproducible_and_ends_with_the_right_outcome():
    def play(game):
        match = Match(game, "random")
        while match.outcome is None:
            match.move(match.board.legal_moves()[0])
        return match.board.cells, match.outcome, match.reward

    assert play(Game(7, True)) == play(Game(7, True))
    _cells, outcome, value = play(Game(7, True))
    assert outcome in {"win", "loss", "draw"} and value == reward(outcome, 0)
    second = Match(Game(2, policy_first=False))
    assert second.board.cells.count("O") == 1 and second.last_opponent is not None


def test_an_illegal_move_ends_the_match_with_partial_credit():
    match = Match(Game(1, True))
    match.move(5)
    match.move(5)  # taken
    assert match.outcome == "illegal" and match.legal_moves == 1
    assert match.reward == pytest.approx(0.05)
    unreadable = Match(Game(1, True))
    unreadable.move(None)
    assert unreadable.outcome == "illegal" and unreadable.reward == 0.0
