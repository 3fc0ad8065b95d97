"""What a server knows of finished steps from disk alone: a step's result as a wire type,
the step a request id already trained (so a retry after a crash trains nothing twice),
and the checkpoints a model has. Paths go out relative to the server's root."""

from __future__ import annotations

import json
from pathlib import Path

from rlcoach.backend.local import StepResult
from rlcoach.backend.step_commit import STEP_RECORD
from rlcoach.paths import RunPaths, is_checkpoint
from rlcoach.serve.wire import CheckpointInfo, StepResultWire

__all__ = ["finished_step", "list_checkpoints", "step_result_wire"]


def step_result_wire(result: StepResult, root: Path, kind: str = "rl") -> StepResultWire:
    checkpoint = None
    if result.checkpoint is not None:
        checkpoint = str(Path(result.checkpoint).resolve().relative_to(root))
    return StepResultWire(
        step=result.step,
        kind=kind,
        stats=result.stats.as_dict(),
        checkpoint=checkpoint,
        publish_seconds=result.publish_seconds,
        save_seconds=result.save_seconds,
        staleness=result.staleness.as_dict() if result.staleness is not None else None,
        timings=dict(result.timings),
        rendering=dict(result.rendering),
    )


def finished_step(paths: RunPaths, request_id: str, root: Path) -> StepResultWire | None:
    """The result of an already trained request id, from its result file or checkpoint."""
    result_file = paths.dir / "requests" / f"{request_id}.result.json"
    if result_file.is_file():
        wire = StepResultWire.model_validate_json(result_file.read_text(encoding="utf-8"))
        return wire.model_copy(update={"replayed": True})
    if not paths.checkpoints.is_dir():
        return None
    for folder in paths.checkpoints.iterdir():
        record_file = folder / STEP_RECORD
        if not is_checkpoint(folder) or not record_file.is_file():
            continue  # a step that never committed did not happen
        record = json.loads(record_file.read_text(encoding="utf-8"))
        if record.get("request_id") == request_id:
            return StepResultWire(
                step=int(folder.name),
                kind=record.get("kind", "rl"),
                stats=record["stats"],
                checkpoint=str(folder.resolve().relative_to(root)),
                replayed=True,
            )
    return None


def list_checkpoints(paths: RunPaths, root: Path) -> list[CheckpointInfo]:
    found = []
    if paths.checkpoints.is_dir():
        for folder in sorted(paths.checkpoints.iterdir()):
            if is_checkpoint(folder):
                size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
                found.append(
                    CheckpointInfo(
                        step=int(folder.name),
                        bytes=size,
                        served=False,
                        path=str(folder.resolve().relative_to(root)),
                    )
                )
    return found
