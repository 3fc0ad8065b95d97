"""The held-out curve of `rlcoach mcp train`: base -> SFT -> RL, and the score that
picks the checkpoint served at the end.

A few GRPO steps on a few dozen scenarios can leave a policy worse than the SFT warm-up
it started from (measured: held-out success 0.438 -> 0.375 on a time server, 0.958 ->
0.833 on a calculator). So the RL phase runs through core's `run_pipeline` with a
`Validation` whose scorer is `HeldOutCurve.score`: the held-out split is evaluated every
`eval_every` RL steps and after the last, the best checkpoint by (success, reward) is
kept, RL stops early after `patience` evaluations below the best (a tie is no fall:
`plateau_stops=False`), and at the end the best is served again (`model.restore`, a new
step, a `restore` line in `metrics.jsonl`) when it is not the latest. The SFT warm-up's
evaluation is the pipeline's baseline, so the warm-up competes with the RL steps; the
base model, without a checkpoint, is on the curve but never restored. Ties go to the
earlier step (fewer updates, same score). This module only records: the loop, the
keep-best and the early stop are core's.
"""

from __future__ import annotations

from typing import Any

from rlcoach.model import TrainableModel

__all__ = ["HeldOutCurve"]


class HeldOutCurve:
    """The held-out evaluations by model step (base -> SFT -> RL), the report's curve;
    its `score` is the validation's scorer: (success, reward) of the served step,
    reused when that step was evaluated last (the base or the SFT warm-up)."""

    def __init__(self, evaluate: Any, model: TrainableModel) -> None:
        self.evaluate, self.model = evaluate, model
        self.points: list[dict[str, Any]] = []
        self.first_rl = 0

    async def add(self, key: str, label: str, description: str) -> dict[str, float]:
        result = await self.evaluate(key, description)
        self.points.append({"step": self.model.step, "label": label, **result})
        return result

    async def score(self) -> tuple[float, float]:
        step = self.model.step
        if not self.points or self.points[-1]["step"] != step:
            done = step - self.first_rl
            await self.add(f"step{step}", f"RL {done}", f"at model step {step}")
        point = self.points[-1]
        return (round(point["success"], 6), round(point["reward"], 6))

    def at(self, step: int | None) -> dict[str, Any] | None:
        return next((p for p in reversed(self.points) if p["step"] == step), None)
