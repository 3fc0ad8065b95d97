"""2048 as a programmatic environment: slide and merge rules, seeded tile spawns, reward.

The rules are the game's: a move slides every tile as far as it goes in one direction;
two equal tiles that meet merge into one of twice the value, which adds that value to
the score; a tile made by a merge does not merge again in the same move (`2 2 2 2` left
is `4 4 . .`, `4 4 8 .` left is `8 8 . .`). A move that changes nothing is not a move:
no tile spawns. After a real move a 2 (nine times in ten) or a 4 appears on a random empty
cell. Spawns come from a generator seeded by the instance, so the same moves from the
same start always give the same boards.

An episode is a short horizon (`moves` turns) from a mid-game start, because a whole
game is hundreds of moves — too long for a CPU budget. The yardstick is a greedy player
that always takes the move with the largest immediate merge score, replayed on the same
instance: success means scoring at least as much as it. The reward has partial credit:

    reward = 0.3 * (valid moves / moves) + 0.7 * min(score / greedy score, 1)

so a policy that only learns to make moves that change the board already gains, and
merging well gains more. An unreadable reply ends the episode (the remaining turns count
as invalid moves).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

DIRECTIONS = ("left", "right", "up", "down")
Grid = tuple[tuple[int, ...], ...]


def slide_row(row: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """Slide one row to the left, merging pairs once; returns (row, score gained)."""
    tiles = [v for v in row if v]
    merged: list[int] = []
    score = 0
    i = 0
    while i < len(tiles):
        if i + 1 < len(tiles) and tiles[i] == tiles[i + 1]:
            merged.append(2 * tiles[i])
            score += 2 * tiles[i]
            i += 2
        else:
            merged.append(tiles[i])
            i += 1
    return tuple(merged + [0] * (len(row) - len(merged))), score


def _transpose(grid: Grid) -> Grid:
    return tuple(zip(*grid, strict=True))


def _mirror(grid: Grid) -> Grid:
    return tuple(tuple(reversed(row)) for row in grid)


def slide(grid: Grid, direction: str) -> tuple[Grid, int]:
    """The grid after sliding in `direction`, and the merge score of the move."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r} is not one of {', '.join(DIRECTIONS)}")
    view = grid
    if direction in ("up", "down"):
        view = _transpose(view)
    if direction in ("right", "down"):
        view = _mirror(view)
    rows = [slide_row(row) for row in view]
    result: Grid = tuple(row for row, _ in rows)
    if direction in ("right", "down"):
        result = _mirror(result)
    if direction in ("up", "down"):
        result = _transpose(result)
    return result, sum(score for _, score in rows)


def legal_moves(grid: Grid) -> list[str]:
    """The directions that change the grid."""
    return [d for d in DIRECTIONS if slide(grid, d)[0] != grid]


def spawn(grid: Grid, rng: random.Random) -> Grid:
    """A 2 (or, one time in ten, a 4) on a random empty cell."""
    empty = [(r, c) for r, row in enumerate(grid) for c, v in enumerate(row) if v == 0]
    if not empty:
        return grid
    r, c = rng.choice(empty)
    value = 4 if rng.random() < 0.1 else 2
    rows = [list(row) for row in grid]
    rows[r][c] = value
    return tuple(tuple(row) for row in rows)


def render(grid: Grid) -> str:
    return "\n".join(" ".join(f"{v if v else '.':>3}" for v in row) for row in grid)


def parse_direction(text: str | None) -> str | None:
    """The first of left/right/up/down named in a reply, or None."""
    found = re.search(r"\b(left|right|up|down)\b", (text or "").lower())
    return found.group(1) if found else None


@dataclass(frozen=True, slots=True)
class Start:
    """One instance: a seed that fixes the start board and every later spawn."""

    seed: int
    size: int = 4
    warmup: int = 12
    """Random moves played from two tiles to reach a mid-game board."""

    def board(self) -> Grid:
        rng = random.Random(f"start-{self.seed}")
        grid: Grid = tuple((0,) * self.size for _ in range(self.size))
        grid = spawn(spawn(grid, rng), rng)
        for _ in range(self.warmup):
            moves = legal_moves(grid)
            if not moves:
                break
            grid = spawn(slide(grid, rng.choice(moves))[0], rng)
        return grid


class Episode:
    """A short game from an instance's start board; the policy calls `play`."""

    def __init__(self, start: Start) -> None:
        self.grid = start.board()
        self.rng = random.Random(f"spawns-{start.seed}")
        self.score = 0
        self.valid = 0
        self.turns = 0

    def play(self, direction: str | None) -> bool:
        """One turn; True when the move changed the board."""
        self.turns += 1
        if direction is None:
            return False
        grid, score = slide(self.grid, direction)
        if grid == self.grid:
            return False
        self.grid = spawn(grid, self.rng)
        self.score += score
        self.valid += 1
        return True

    @property
    def max_tile(self) -> int:
        return max(max(row) for row in self.grid)


def greedy_score(start: Start, moves: int) -> int:
    """The score of the greedy player (largest immediate merge; ties in DIRECTIONS order)."""
    episode = Episode(start)
    for _ in range(moves):
        options = legal_moves(episode.grid)
        if not options:
            break
        episode.play(max(options, key=lambda d: slide(episode.grid, d)[1]))
    return episode.score


def reward(valid: int, score: int, greedy: int, moves: int) -> float:
    """See the module docstring; a greedy score of 0 counts any valid play as matching."""
    ratio = min(score / greedy, 1.0) if greedy > 0 else 1.0
    return 0.3 * valid / moves + 0.7 * ratio * (valid > 0)
