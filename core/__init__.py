"""rlcoach: train LLM agents with reinforcement learning from the code you already have.

The loop: agent code calls the policy through an OpenAI client inside a rollout scope;
the policy endpoint records the exact sampled tokens; a reward is attached; `train()`
turns scored groups into a new LoRA that the engine serves a moment later.

Importing `rlcoach` imports no optional dependency (vLLM, LangGraph, MCP, Langfuse, W&B)
and not torch either: engines and the trainer load on first use.
"""

from rlcoach.backend import Backend, LocalBackend, StepResult
from rlcoach.bundled import BUNDLED_MODEL
from rlcoach.config import EngineConfig, LoraConfig, SFTConfig, TrainConfig
from rlcoach.dataset import DatasetBatch, iterate_dataset
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
from rlcoach.gather import AfterEach, RolloutFn, gather_trajectory_groups, retry
from rlcoach.model import Model, TrainableModel
from rlcoach.remote import RemoteBackend
from rlcoach.rollout import Rollout, current_rollout_id
from rlcoach.sinks import Sink, SinkConfig
from rlcoach.types import (
    ChatRecord,
    History,
    RolloutFailure,
    SampledChoice,
    Trajectory,
    TrajectoryGroup,
    Verdict,
    load_groups,
    save_groups,
    tool_message,
)
from rlcoach.usage import ModelUsage

__version__ = "0.1.0"

__all__ = [
    "BUNDLED_MODEL",
    "AfterEach",
    "Backend",
    "ChatRecord",
    "CheckpointError",
    "ConfigError",
    "DatasetBatch",
    "EngineConfig",
    "EngineError",
    "EngineStartError",
    "History",
    "LocalBackend",
    "LoraConfig",
    "Model",
    "ModelUsage",
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
    "TrainConfig",
    "TrainableModel",
    "TrainerError",
    "TrainingDataError",
    "Trajectory",
    "TrajectoryGroup",
    "UnknownModelError",
    "Verdict",
    "__version__",
    "current_rollout_id",
    "gather_trajectory_groups",
    "iterate_dataset",
    "load_groups",
    "retry",
    "save_groups",
    "tool_message",
]
