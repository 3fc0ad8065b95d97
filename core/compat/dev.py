"""ART's `art.dev` dict types, so `art.dev.InternalModelConfig(...)` runs as ART writes it.

In ART these are `TypedDict`s: calling one returns a plain dict. Here they are too, with
the keys rlcoach maps onto its own configs (art_config.py); `_internal_config=` and
`_config=` take the dicts they build, translate each known key and refuse an unknown one
naming the rlcoach field to set instead. The other names of ART's `art.dev` (Tinker,
server arguments, ...) raise an `AttributeError` that says what to write.
"""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = [
    "EngineArgs",
    "InitArgs",
    "InternalModelConfig",
    "PeftArgs",
    "TrainConfig",
    "TrainerArgs",
]


class InitArgs(TypedDict, total=False):
    """`init_args`: `max_seq_length` becomes `EngineConfig.max_model_len`."""

    max_seq_length: int
    gpu_memory_utilization: float
    load_in_4bit: bool
    load_in_8bit: bool
    fast_inference: bool
    use_exact_model_name: bool


class EngineArgs(TypedDict, total=False):
    """`engine_args`: vLLM settings, as `EngineConfig` fields or vLLM flags."""

    gpu_memory_utilization: float
    max_model_len: int
    enforce_eager: bool
    enable_prefix_caching: bool
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_sleep_mode: bool
    num_scheduler_steps: int
    disable_log_stats: bool
    disable_log_requests: bool


class PeftArgs(TypedDict, total=False):
    """`peft_args`: the adapter, as `LoraConfig` fields."""

    r: int
    lora_alpha: int
    lora_dropout: float
    target_modules: list[str]
    use_gradient_checkpointing: bool | str
    random_state: int
    bias: str


class TrainerArgs(TypedDict, total=False):
    """`trainer_args`: optimizer settings, as `TrainConfig` fields."""

    learning_rate: float
    max_grad_norm: float
    weight_decay: float
    beta: float


class InternalModelConfig(TypedDict, total=False):
    """`TrainableModel(_internal_config=...)` as ART spells it."""

    init_args: InitArgs
    engine_args: EngineArgs
    peft_args: PeftArgs
    trainer_args: TrainerArgs
    _decouple_vllm_and_unsloth: bool


class TrainConfig(TypedDict, total=False):
    """`model.train(groups, _config=...)`: per-step options (not `rlcoach.TrainConfig`)."""

    learning_rate: float
    beta: float
    epsilon: float
    epsilon_high: float
    scale_rewards: bool
    max_grad_norm: float
    logprob_calculation_chunk_size: int
    loss_fn: str
    allow_training_without_logprobs: bool
    precalculate_logprobs: bool
    plot_tensors: bool


def __getattr__(name: str) -> Any:
    raise AttributeError(
        f"module 'rlcoach.compat.dev' has no attribute {name!r} (an OpenPipe ART name rlcoach does "
        "not have); fix: set rlcoach's configs directly — LocalBackend(engine={...}) for "
        "the engine, TrainConfig(...) for the step and TrainConfig(lora={...}) for the adapter"
    )
