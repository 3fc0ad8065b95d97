"""Keep the best checkpoint by held-out success: RL that adds to SFT, never subtracts.

A few GRPO steps on a few dozen scenarios can leave a policy worse than the SFT warm-up
it started from (measured before this module: held-out success 0.438 -> 0.375 on a time
server, 0.958 -> 0.833 on a calculator). So `rlcoach mcp train` evaluates the held-out
split every `eval_every` RL steps (`HeldOutCurve`), remembers the best checkpoint by
(success, reward), stops early after `patience` evaluations below the best (a tie is
not a fall), and
at the end serves the best: when it is not the latest step, `model.restore(step)` makes
it the model's next step (its adapter and optimizer state committed as a new step, a
`restore` line in `metrics.jsonl`). The steps after the best stay on disk, and the curve
in the report shows every evaluation. Ties go to the earlier step (fewer updates, same
score).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["HeldOutCurve"]


@dataclass
class HeldOutCurve:
    """Held-out evaluations by model step, the best so far, and when to stop."""

    patience: int = 2
    points: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None
    behind: int = 0
    """Evaluations below the best since it was set (ties not counted)."""

    def add(self, step: int, label: str, result: dict[str, float]) -> bool:
        """Record the evaluation of model step `step`; True when it is the best so far."""
        point = {"step": step, "label": label, **result}
        self.points.append(point)
        if self.best is None or _key(point) > _key(self.best):
            self.best, self.behind = point, 0
            return True
        if _key(point) < _key(self.best):
            self.behind += 1  # a tie is no fall: it neither counts nor resets
        return False

    @property
    def falling(self) -> bool:
        """Whether `patience` evaluations since the best were below it: stop."""
        return self.behind >= self.patience


def _key(point: dict[str, Any]) -> tuple[float, float]:
    return (round(point["success"], 6), round(point["reward"], 6))
