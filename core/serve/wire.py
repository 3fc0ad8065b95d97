"""Wire types of `rlcoach serve`: what `RemoteBackend` and the server say to each other.

Every route lives under `/rlcoach/v1/`; a change that an older client could misread gets
a new prefix (and a new `API_VERSION`), never a silent change of these models. The
policy endpoint itself is plain OpenAI (`/v1/chat/completions`, `/v1/models`) and has no
types here. Training answers with a stream of `TrainEvent` JSON lines (NDJSON): the
server acknowledges an upload only once its trajectories are on disk, sends heartbeats
while the step runs, and ends with the step's result or an error. Errors everywhere are
OpenAI-shaped (`{"error": {"message", "type", "param", "code"}}`), so any HTTP client
that knows OpenAI's errors knows ours.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from rlcoach.config import SFTConfig, TrainConfig
from rlcoach.trajectory.trajectories import ChatRecord, Trajectory, TrajectoryGroup

__all__ = [
    "API_PREFIX",
    "API_VERSION",
    "CheckpointInfo",
    "CheckpointList",
    "ErrorBody",
    "LogRequest",
    "ModelRef",
    "RegisterResponse",
    "SFTRequest",
    "StepResultWire",
    "TrainEvent",
    "TrainRequest",
    "error_body",
]

API_VERSION = "v1"
API_PREFIX = f"/rlcoach/{API_VERSION}"

_REQUEST_ID = r"^[A-Za-z0-9_-]{8,64}$"


class _Wire(BaseModel):
    # NaN travels as NaN (a skipped step's loss), not as a null that fails validation.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class ErrorBody(_Wire):
    """The inside of an OpenAI-shaped error."""

    message: str
    """What is wrong, why, and the fix."""
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    """A stable machine-readable reason (`invalid_api_key`, `too_large`, `busy`, ...)."""


def error_body(
    message: str,
    *,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """`{"error": {...}}` as OpenAI's API writes it."""
    return {"error": ErrorBody(message=message, type=kind, param=param, code=code).model_dump()}


class ModelRef(_Wire):
    """A trainable model as the server should register it (idempotent)."""

    name: str
    """Model name; checked on the server as one safe path component."""
    project: str
    """Project name; checked on the server as one safe path component."""
    base_model: str
    """The bundled model's name, or a model folder on the server."""
    config: TrainConfig = Field(default_factory=TrainConfig)
    """The model's default training config."""


class RegisterResponse(_Wire):
    """Where the model stands on the server after registration."""

    served_name: str
    """`name@step`, the name to put in chat requests."""
    step: int
    """The latest complete checkpoint (0: base weights)."""
    base_model: str


class TrainRequest(_Wire):
    """One training step: a batch of scored groups for a model."""

    request_id: str = Field(pattern=_REQUEST_ID)
    """Chosen by the client, reused on every retry: the server trains each id once and
    answers a retry with the first result."""
    model: ModelRef
    """The model to train (registered on the fly after a server restart)."""
    groups: list[TrajectoryGroup]
    config: TrainConfig | None = None
    """This step's config; None uses the model's."""


class LogRequest(_Wire):
    """Groups recorded without training (`model.log`): an evaluation of a split."""

    model: ModelRef
    groups: list[TrajectoryGroup]
    split: str = "val"
    step: int | None = None
    """The step the record is filed under; None: the model's current step."""
    metrics: dict[str, float] = Field(default_factory=dict)
    """More numbers for the record (named `<split>/<key>`)."""


def _example_kind(value: Any) -> str:
    """A trajectory always carries its `id`; a chat record never does."""
    if isinstance(value, dict):
        return "trajectory" if "id" in value else "record"
    return "trajectory" if isinstance(value, Trajectory) else "record"


SFTExample = Annotated[
    Annotated[Trajectory, Tag("trajectory")] | Annotated[ChatRecord, Tag("record")],
    Discriminator(_example_kind),
]


class SFTRequest(_Wire):
    """One supervised fine-tuning step: examples to imitate, for a model."""

    request_id: str = Field(pattern=_REQUEST_ID)
    """As in `TrainRequest`: the server runs each id once."""
    model: ModelRef
    examples: list[SFTExample]
    """Trajectories and chat records, in the order the client passed them."""
    config: SFTConfig | None = None
    """None: `SFTConfig()`'s defaults."""


class StepResultWire(_Wire):
    """What a step did, as `StepResult` holds it (paths relative to the server's root)."""

    step: int
    kind: Literal["rl", "sft"] = "rl"
    """Which trainer ran: `stats` holds `StepStats` (rl) or `SFTStats` (sft) fields."""
    stats: dict[str, float | int | bool]
    """The step's stats (loss, grad_norm, trained, ...)."""
    checkpoint: str | None = None
    """The checkpoint folder relative to the server's root; None when nothing trained."""
    publish_seconds: float = 0.0
    save_seconds: float = 0.0
    staleness: dict[str, float | int] | None = None
    """What the staleness bound dropped (`rlcoach.rollout.staleness.Staleness` fields); None
    for SFT."""
    timings: dict[str, float] = Field(default_factory=dict)
    """Phases beside training (`sleep_seconds`, `wake_seconds` of a sleeping engine)."""
    rendering: dict[str, float] = Field(default_factory=dict)
    """Client-built trajectories rendered for the step (`StepResult.rendering`)."""
    replayed: bool = False
    """True when this answers a retried request id that was already trained."""


class TrainEvent(_Wire):
    """One line of the training stream."""

    event: Literal["accepted", "training", "heartbeat", "result", "error"]
    request_id: str
    result: StepResultWire | None = None
    """Set on the `result` event."""
    error: ErrorBody | None = None
    """Set on the `error` event."""
    retryable: bool = False
    """On `error`: whether sending the same request again may succeed."""


class CheckpointInfo(_Wire):
    """One complete checkpoint of a model."""

    step: int
    path: str
    """Relative to the server's root."""
    bytes: int
    served: bool
    """Whether it is the model's latest step (the one `name` resolves to)."""


class CheckpointList(_Wire):
    checkpoints: list[CheckpointInfo]
    latest: int
