"""The backend room: a model's training on this machine, one committed step at a time.

`LocalBackend` (`local`) assembles the engine, the endpoint and the trainer; a step's
commit point and rollback (`step_commit`), the training loop (`pipeline`), which
checkpoints a run keeps (`retention`, `evaluation`), checks on training input
(`training_input`), the engine's supervision (`supervisor`) and colocation on one GPU
(`colocation`).

May import: every room below it (foundation, runtime, compat, models, trajectory,
engines, trainer, endpoint, rollout, observe). Never imports: serve.
"""

from rlcoach.backend.local import (
    STEP_RECORD,
    Backend,
    LocalBackend,
    StepResult,
    resolve_base_model,
    served_base_name,
)

# What the module `rlcoach.backend` exported before it became this room.
__all__ = [
    "STEP_RECORD",
    "Backend",
    "LocalBackend",
    "StepResult",
    "resolve_base_model",
    "served_base_name",
]
