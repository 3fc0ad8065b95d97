"""rlcoach: train LLM agents with reinforcement learning from the code you already have.

The loop: agent code calls the policy through an OpenAI client inside a rollout scope;
the policy endpoint records the exact sampled tokens; a reward is attached; `train()`
turns scored groups into a new LoRA that the engine serves a moment later.

Importing `rlcoach` imports no optional dependency (vLLM, LangGraph, MCP, Langfuse, W&B)
and not torch either: engines and the trainer load on first use.
"""

from rlcoach.backend.local import Backend, LocalBackend, StepResult
from rlcoach.backend.pipeline import PipelineRun, PipelineStep, Validation, run_pipeline
from rlcoach.compat import moved as _moved
from rlcoach.config import EngineConfig, LoraConfig, SFTConfig, TrainConfig
from rlcoach.errors import (
    CheckpointError,
    ConfigError,
    EngineError,
    EngineStartError,
    RemoteError,
    RLCoachError,
    RolloutError,
    TrainerError,
    TrainingDataError,
    UnknownModelError,
)
from rlcoach.model import Model, PendingStep, TrainableModel
from rlcoach.models.bundled import BUNDLED_MODEL
from rlcoach.models.usage import ModelUsage
from rlcoach.observe.sinks import Sink, SinkConfig
from rlcoach.rollout.gather import (
    AfterEach,
    RolloutFn,
    gather_trajectories,
    gather_trajectory_groups,
    retry,
)
from rlcoach.rollout.scope import Rollout, current_rollout_id
from rlcoach.rollout.teacher import Teacher, TeacherScores
from rlcoach.serve.remote import RemoteBackend
from rlcoach.trajectory.dataset import DatasetBatch, iterate_dataset
from rlcoach.trajectory.trajectories import (
    ChatRecord,
    ClientChoice,
    History,
    Messages,
    MessagesAndChoices,
    RolloutFailure,
    SampledChoice,
    Tools,
    Trajectory,
    TrajectoryGroup,
    Verdict,
    load_groups,
    save_groups,
    tool_message,
)

_moved.install()

__version__ = "0.1.0"

__all__ = [
    "BUNDLED_MODEL",
    "AfterEach",
    "Backend",
    "ChatRecord",
    "CheckpointError",
    "ClientChoice",
    "ConfigError",
    "DatasetBatch",
    "EngineConfig",
    "EngineError",
    "EngineStartError",
    "History",
    "LocalBackend",
    "LoraConfig",
    "Messages",
    "MessagesAndChoices",
    "Model",
    "ModelUsage",
    "PendingStep",
    "PipelineRun",
    "PipelineStep",
    "RLCoachError",
    "RemoteBackend",
    "RemoteError",
    "Rollout",
    "RolloutError",
    "RolloutFailure",
    "RolloutFn",
    "SFTConfig",
    "SampledChoice",
    "Sink",
    "SinkConfig",
    "StepResult",
    "Teacher",
    "TeacherScores",
    "Tools",
    "TrainConfig",
    "TrainableModel",
    "TrainerError",
    "TrainingDataError",
    "Trajectory",
    "TrajectoryGroup",
    "UnknownModelError",
    "Validation",
    "Verdict",
    "__version__",
    "current_rollout_id",
    "gather_trajectories",
    "gather_trajectory_groups",
    "iterate_dataset",
    "load_groups",
    "retry",
    "run_pipeline",
    "save_groups",
    "tool_message",
]

_ART_NAMES = {
    "LocalAPI": "that is ART's old name; write LocalBackend()",
    "API": "write LocalBackend() (or RemoteBackend(url) for `rlcoach serve`)",
    "ServerlessBackend": "rlcoach has no hosted service; run `rlcoach serve` on a GPU machine "
    "and use RemoteBackend(url)",
    "SkyPilotBackend": "start `rlcoach serve` on the cluster (e.g. with SkyPilot) and use "
    "RemoteBackend(url)",
    "auto_trajectory": "open a scope instead: `async with model.rollout() as rollout:` records "
    "every call made through model.openai_client()",
    "capture_auto_trajectory": "open a scope instead: `async with model.rollout() as rollout:`",
    "yield_trajectory": "return `rollout.trajectory` from a `model.rollout()` scope",
    "capture_yielded_trajectory": "return `rollout.trajectory` from a `model.rollout()` scope",
    "TrainSFTConfig": "write SFTConfig(...) and model.train_sft(data, config)",
    "trajectory_group_batches": "write iterate_dataset(items, batch_size, epochs)",
}
"""ART names rlcoach does not have, and what to write instead."""


def __getattr__(name: str) -> object:
    if name == "dev":  # ART's `art.dev.InternalModelConfig(...)` and friends (dev.py)
        import importlib

        return importlib.import_module("rlcoach.compat.dev")
    if name in _ART_NAMES:
        raise AttributeError(
            f"module 'rlcoach' has no attribute {name!r} (an OpenPipe ART name): {_ART_NAMES[name]}"
        )
    raise AttributeError(f"module 'rlcoach' has no attribute {name!r}")
