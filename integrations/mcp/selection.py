"""Keep the best checkpoint by held-out success: RL that adds to SFT, never subtracts.

A few GRPO steps on a few dozen scenarios can leave a policy worse than the SFT warm-up
it started from (measured before this module: held-out success 0.438 -> 0.375 on a time
server, 0.958 -> 0.833 on a calculator). So `rlcoach mcp train` evaluates the held-out
split every `eval_every` RL steps (`HeldOutCurve`), remembers the best checkpoint by
(success, reward), stops early after `patience` evaluations below the best (a tie is
not a fall), and
at the end serves the best: when it is not the latest step, `restore_checkpoint` makes
it the model's next step — its adapter and optimizer state copied into a new checkpoint
folder, written as a step is (a temp folder renamed into place), and published by
registering the model again. The steps after the best stay on disk, and the curve in the
report shows every evaluation. Ties go to the earlier step (fewer updates, same score).
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlcoach import LocalBackend, TrainableModel
from rlcoach.paths import RunPaths, append_jsonl, fsync_dir, fsync_tree, write_text_atomic

__all__ = ["HeldOutCurve", "restore_checkpoint"]

_STEP_FILES = ("rlcoach_step.json", "rlcoach_metrics.json", ".uncommitted")
"""Files of a checkpoint that belong to the step that wrote it, not to its weights."""


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


async def restore_checkpoint(model: TrainableModel, backend: LocalBackend, step: int) -> int:
    """Make checkpoint `step` of `model` its latest (a new step with the same adapter and
    optimizer state) and serve it; returns the new step. The model's trainer in memory
    is dropped, so a later step starts from the restored weights."""
    paths: RunPaths = backend.paths(model)
    source = paths.checkpoint(step)
    new = model.step + 1

    def copy() -> Path:
        temp = paths.temp_checkpoint()
        for entry in source.iterdir():
            if entry.name in _STEP_FILES:
                continue
            target = temp / entry.name
            if entry.is_dir():
                shutil.copytree(entry, target)
            else:
                shutil.copy2(entry, target)
        write_text_atomic(temp / "restored_from.json", f'{{"step": {step}}}\n')
        fsync_tree(temp)
        final = paths.checkpoint(new)
        temp.rename(final)
        fsync_dir(paths.checkpoints)
        return final

    await asyncio.to_thread(copy)
    _drop_trainer(backend, model)
    await model.register(backend)  # publishes the latest checkpoint: the restored one
    append_jsonl(paths.metrics, {"event": "mcp_restore", "step": model.step, "from_step": step})
    return model.step


def _drop_trainer(backend: LocalBackend, model: TrainableModel) -> None:
    """Close the trainer a backend keeps for `model` (its weights are those of the last
    step, not the restored one); the next step loads one from the latest checkpoint.
    The backend's pool is the one place that holds it: a public way to say "this model's
    checkpoints changed on disk" would replace this."""
    pool = getattr(backend, "_pool", None)
    if pool is None or pool.peek(model.name) is None:
        return
    trainer = pool.acquire(model.name, lambda: None)
    pool.release(model.name, trainer, discard=True)
