"""The rlcoach error tree.

One root, `RLCoachError`; each category also inherits the standard exception it
replaces, so `except ValueError` in user code keeps working. Messages name the bad
value, the reason and the fix. Every error rlcoach and its plugins raise on purpose is
in this tree (a test walks every public exception class); configs raise `ConfigError`
however they are built (`rlcoach.config.Config`). A failed rollout is data (recorded on
the group and counted), not a crash: `RolloutError` exists for the strict mode and for
the limit above which a step refuses to train on what is left.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AnswerError",
    "CheckpointError",
    "ConfigError",
    "DataError",
    "EngineError",
    "EngineHTTPError",
    "EngineStartError",
    "MissingDependencyError",
    "RLCoachError",
    "RemoteError",
    "RolloutError",
    "ToolSchemaError",
    "TrainerError",
    "TrainingDataError",
    "UnknownModelError",
    "UnknownNameError",
    "UsageError",
]


class RLCoachError(Exception):
    """Root of every error rlcoach raises on purpose."""

    retryable: bool = False
    """Whether the same request may succeed if sent again: `rlcoach serve` tells its
    clients so, and only then do they retry. False unless the failure is transient."""


class ConfigError(RLCoachError, ValueError):
    """A configuration value or argument is invalid (names the field, the value and the fix)."""


class UsageError(RLCoachError, TypeError):
    """Something of the wrong kind was passed or returned: an option rlcoach sets itself,
    a rollout function that returns no `Trajectory`."""


class MissingDependencyError(RLCoachError, ImportError):
    """An optional dependency is not installed (names the extra that brings it)."""


class DataError(RLCoachError, ValueError):
    """A data file or record is not what it should be (names the file and line)."""


class TrainingDataError(DataError):
    """Trajectories handed to the trainer cannot be trained on as they are."""


class AnswerError(RLCoachError, ValueError):
    """A model's answer is not in the form it was asked for (no JSON object, a field
    missing); the caller retries, or counts the failure."""


class ToolSchemaError(ConfigError):
    """A tool's parameter schema holds a keyword the sampling grammar cannot enforce (the
    policy endpoint answers it with a 400 before sampling); `tool`, `keyword` and `path`
    say where."""

    def __init__(self, tool: str, keyword: str, path: str, reason: str) -> None:
        super().__init__(
            f"tool {tool!r}: `{keyword}` at {path} in its parameters: {reason}, so a forced "
            f"or strict call could not be held to the schema; fix: remove `{keyword}` from "
            "the schema (check the value in your tool instead) or do not force the call"
        )
        self.tool = tool
        self.keyword = keyword
        self.path = path


class UnknownModelError(RLCoachError, LookupError):
    """A served name such as `name@step` that the policy server does not have."""


class UnknownNameError(RLCoachError, KeyError):
    """A name a fixed table does not hold (a model family); the message lists the known."""

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0]) if self.args else ""


class EngineError(RLCoachError, RuntimeError):
    """The inference engine failed or is not reachable."""

    retryable = True  # a dead engine is restarted by the supervisor


class EngineHTTPError(EngineError):
    """The engine refused a request; `status` and `body` are passed on to the client."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        fix = (
            "fix the request as the body says"
            if 400 <= status < 500
            else "retry, or read the engine's log"
        )
        super().__init__(f"the engine answered HTTP {status}: {body}; fix: {fix}")
        self.status = status
        self.body = body
        self.retryable = status >= 500 or status == 429  # a refused request stays refused


class EngineStartError(EngineError):
    """The inference engine could not be started (the message points at its log)."""

    retryable = False


class CheckpointError(RLCoachError, OSError):
    """A checkpoint is missing, partial or cannot be written."""


class TrainerError(RLCoachError, RuntimeError):
    """The training processes died, timed out or failed (the message points at their log)."""

    retryable = True  # the next step starts new ranks from the latest checkpoint


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
