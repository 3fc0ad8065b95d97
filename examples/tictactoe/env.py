"""Tic Tac Toe: the board, its rules, a scripted opponent and the reward.

The policy plays X; the opponent (O) is a script: `random` plays a random legal cell,
`blocking` takes a winning cell when it has one, blocks X's winning cell when X has one,
and otherwise plays at random. Both draw from a seeded generator, so an instance — a
`Game(seed, policy_first)` — is reproducible, and held-out games use other seeds.

Cells are numbered 1-9 left to right, top to bottom; free cells are drawn with their
number, so a small model can answer by copying a digit it sees. The reward has partial
credit so that a group of attempts differs even when none wins:

- 1.0 win, 0.6 draw, 0.3 loss (the game was played to the end with legal moves);
- 0.05 per legal move before an illegal or unreadable one, which ends the game (at most
  0.2, below any finished game).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
REWARD = {"win": 1.0, "draw": 0.6, "loss": 0.3}
ILLEGAL_CREDIT_PER_MOVE = 0.05


class IllegalMove(ValueError):
    """A move to a taken cell or outside 1-9."""


@dataclass(slots=True)
class Board:
    cells: list[str] = field(default_factory=lambda: [" "] * 9)

    def legal_moves(self) -> list[int]:
        return [i + 1 for i, c in enumerate(self.cells) if c == " "]

    def play(self, cell: int, mark: str) -> None:
        if not 1 <= cell <= 9:
            raise IllegalMove(f"cell {cell} is outside 1-9")
        if self.cells[cell - 1] != " ":
            raise IllegalMove(f"cell {cell} is taken by {self.cells[cell - 1]}")
        self.cells[cell - 1] = mark

    def winner(self) -> str | None:
        for a, b, c in LINES:
            if self.cells[a] != " " and self.cells[a] == self.cells[b] == self.cells[c]:
                return self.cells[a]
        return None

    def over(self) -> bool:
        return self.winner() is not None or not self.legal_moves()

    def render(self) -> str:
        shown = [c if c != " " else str(i + 1) for i, c in enumerate(self.cells)]
        rows = ["|".join(shown[r * 3 : r * 3 + 3]) for r in range(3)]
        return "\n-+-+-\n".join(rows)


def winning_cell(board: Board, mark: str) -> int | None:
    """A free cell that completes a line of `mark`, if there is one."""
    for a, b, c in LINES:
        line = [board.cells[a], board.cells[b], board.cells[c]]
        if line.count(mark) == 2 and line.count(" ") == 1:
            return (a, b, c)[line.index(" ")] + 1
    return None


def opponent_move(board: Board, rng: random.Random, style: str = "random") -> int:
    """The scripted opponent's cell (O)."""
    if style == "blocking":
        for mark in ("O", "X"):  # win if possible, else block
            cell = winning_cell(board, mark)
            if cell is not None:
                return cell
    elif style != "random":
        raise ValueError(f"opponent style {style!r} is unknown; use 'random' or 'blocking'")
    return rng.choice(board.legal_moves())


def parse_move(text: str | None) -> int | None:
    """The first digit 1-9 in a reply, or None."""
    found = re.search(r"[1-9]", text or "")
    return int(found.group()) if found else None


def reward(outcome: str, legal_moves: int) -> float:
    """`outcome` is win, draw, loss or illegal (see the module docstring)."""
    if outcome == "illegal":
        return min(ILLEGAL_CREDIT_PER_MOVE * legal_moves, 0.2)
    return REWARD[outcome]


@dataclass(frozen=True, slots=True)
class Game:
    """One instance: the opponent's seed and who moves first."""

    seed: int
    policy_first: bool


def games(n: int, start: int) -> list[Game]:
    """`n` games with seeds from `start`; the policy moves first in two of three."""
    return [Game(seed, policy_first=seed % 3 != 2) for seed in range(start, start + n)]


class Match:
    """A game in progress against the scripted opponent; the policy calls `move`."""

    def __init__(self, game: Game, style: str = "random") -> None:
        self.board = Board()
        self.rng = random.Random(game.seed)
        self.style = style
        self.legal_moves = 0
        self.outcome: str | None = None
        self.last_opponent: int | None = None
        if not game.policy_first:
            self._opponent()

    def _opponent(self) -> None:
        self.last_opponent = opponent_move(self.board, self.rng, self.style)
        self.board.play(self.last_opponent, "O")

    def _finish(self) -> None:
        winner = self.board.winner()
        if winner is not None:
            self.outcome = "win" if winner == "X" else "loss"
        elif not self.board.legal_moves():
            self.outcome = "draw"

    def move(self, cell: int | None) -> None:
        """Play X at `cell` (None: unreadable), then the opponent's reply."""
        try:
            if cell is None:
                raise IllegalMove("no cell number in the reply")
            self.board.play(cell, "X")
        except IllegalMove:
            self.outcome = "illegal"
            return
        self.legal_moves += 1
        self._finish()
        if self.outcome is None:
            self._opponent()
            self._finish()

    @property
    def reward(self) -> float:
        return reward(self.outcome, self.legal_moves) if self.outcome else 0.0
