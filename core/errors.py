"""The rlcoach error tree.

One root, `RLCoachError`; each category also inherits the standard exception it
replaces, so `except ValueError` in user code keeps working. Messages name the bad
value, the reason and the fix. A failed rollout is data (recorded on the group and
counted), not a crash: `RolloutError` exists for the strict mode and for the limit
above which a step refuses to train on what is left.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "ConfigError",
    "EngineError",
    "EngineStartError",
    "RLCoachError",
    "RemoteError",
    "RolloutError",
    "TrainerError",
    "TrainingDataError",
    "UnknownModelError",
]


class RLCoachError(Exception):
    """Root of every error rlcoach raises on purpose."""


class ConfigError(RLCoachError, ValueError):
    """A configuration value is invalid (names the field, the value and the fix)."""


class TrainingDataError(RLCoachError, ValueError):
    """Trajectories handed to the trainer cannot be trained on as they are."""


class UnknownModelError(RLCoachError, LookupError):
    """A served name such as `name@step` that the policy server does not have."""


class EngineError(RLCoachError, RuntimeError):
    """The inference engine failed or is not reachable."""


class EngineStartError(EngineError):
    """The inference engine could not be started (the message points at its log)."""


class CheckpointError(RLCoachError, OSError):
    """A checkpoint is missing, partial or cannot be written."""


class TrainerError(RLCoachError, RuntimeError):
    """The training processes died, timed out or failed (the message points at their log)."""


class RolloutError(RLCoachError, RuntimeError):
    """Too many rollouts failed for a step to train on the rest."""


class RemoteError(RLCoachError, RuntimeError):
    """`rlcoach serve` refused or failed a request (`status`, `code`, `retryable` say how)."""

    def __init__(
        self, message: str, *, status: int = 0, code: str | None = None, retryable: bool = False
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retryable = retryable
