"""ART's unstable configuration knobs, translated into rlcoach's configs.

ART scripts tune the engine and the trainer through two loosely typed dicts:
`TrainableModel(_internal_config={...})` (engine, LoRA and trainer settings) and
`model.train(..., _config={...})` (per-step trainer options). rlcoach keeps those
settings in its own typed configs — the engine in `EngineConfig` (the backend's), the
adapter in `LoraConfig`, the step in `TrainConfig` — so each known ART key is mapped onto
its rlcoach field here, and an unknown one is refused with the rlcoach field to use
instead. Keys that only tune ART's own machinery (Unsloth, sleep mode) and have no effect
on what is trained are accepted and logged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rlcoach.config import TrainConfig
from rlcoach.errors import ConfigError

__all__ = ["InternalConfig", "internal_config", "train_options"]

logger = logging.getLogger(__name__)

_ENGINE = {
    "init_args.max_seq_length": "max_model_len",
    "init_args.gpu_memory_utilization": "gpu_memory_utilization",
    "engine_args.gpu_memory_utilization": "gpu_memory_utilization",
    "engine_args.max_model_len": "max_model_len",
}
_ENGINE_FLAGS = {
    "engine_args.enforce_eager": "--enforce-eager",
    "engine_args.enable_prefix_caching": "--enable-prefix-caching",
}
_ENGINE_VALUES = {
    "engine_args.max_num_seqs": "--max-num-seqs",
    "engine_args.max_num_batched_tokens": "--max-num-batched-tokens",
}
_LORA = {
    "peft_args.r": "rank",
    "peft_args.lora_alpha": "alpha",
    "peft_args.lora_dropout": "dropout",
    "peft_args.target_modules": "target_modules",
}
_TRAIN = {
    "trainer_args.learning_rate": "learning_rate",
    "trainer_args.max_grad_norm": "max_grad_norm",
    "trainer_args.weight_decay": "weight_decay",
    "trainer_args.beta": "kl_coef",
    "peft_args.use_gradient_checkpointing": "activation_checkpointing",
}
_NO_EFFECT = {
    "init_args.load_in_4bit",
    "init_args.load_in_8bit",
    "init_args.fast_inference",
    "init_args.use_exact_model_name",
    "engine_args.enable_sleep_mode",
    "engine_args.num_scheduler_steps",
    "engine_args.disable_log_stats",
    "engine_args.disable_log_requests",
    "peft_args.random_state",
    "peft_args.bias",
    "_decouple_vllm_and_unsloth",
}
"""ART knobs of Unsloth and vLLM sleep mode: rlcoach trains the LoRA over full-precision
base weights and starts vLLM itself, so these change nothing here (rlcoach's own sleep
mode is `EngineConfig(colocation="sleep")`, chosen on the backend, colocation.py)."""

_STEP = {
    "logprob_calculation_chunk_size": "logprob_chunk_tokens",
    "epsilon": "clip_low",
    "epsilon_high": "clip_high",
    "scale_rewards": "scale_rewards",
    "learning_rate": "learning_rate",
    "beta": "kl_coef",
    "max_grad_norm": "max_grad_norm",
}
_LOSS_FN = {"cispo": "cispo", "ppo": "grpo"}
"""ART's `loss_fn` names: its PPO loss is rlcoach's clipped `grpo` objective."""
_STEP_NO_EFFECT = {
    "allow_training_without_logprobs",
    "precalculate_logprobs",
    "plot_tensors",
    "verbose",
}
"""rlcoach always trains without recorded log-probs (it computes them) and always computes
the new log-probs in the step, so these need nothing."""

_MIN_CHUNK = 16  # TrainConfig.logprob_chunk_tokens' lower bound


@dataclass(frozen=True, slots=True)
class InternalConfig:
    """An ART `_internal_config`, as rlcoach settings."""

    engine: dict[str, Any] = field(default_factory=dict)
    """`EngineConfig` fields; applied by a `LocalBackend` when it starts the engine."""
    lora: dict[str, Any] = field(default_factory=dict)
    """`LoraConfig` fields."""
    train: dict[str, Any] = field(default_factory=dict)
    """`TrainConfig` fields."""


def _flatten(value: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, Mapping) and not name.endswith("target_modules"):
            out.update(_flatten(item, name + "."))
        else:
            out[name] = item
    return out


def internal_config(value: Mapping[str, Any] | None) -> InternalConfig:
    """ART's `_internal_config` (a dict, or `art.dev.InternalModelConfig`) translated."""
    result = InternalConfig()
    if not value:
        return result
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"_internal_config={value!r} is not a dict; fix: pass ART's dict form, e.g. "
            "{'init_args': {'max_seq_length': 8192}}, or set rlcoach's configs directly"
        )
    extra_args: list[str] = []
    for key, item in _flatten(value).items():
        if key in _ENGINE:
            result.engine[_ENGINE[key]] = item
        elif key in _ENGINE_FLAGS:
            if item:
                extra_args.append(_ENGINE_FLAGS[key])
        elif key in _ENGINE_VALUES:
            extra_args += [_ENGINE_VALUES[key], str(item)]
        elif key in _LORA:
            result.lora[_LORA[key]] = item
        elif key in _TRAIN:
            result.train[_TRAIN[key]] = bool(item) if key.endswith("checkpointing") else item
        elif key in _NO_EFFECT:
            logger.info("_internal_config %s=%r has no effect in rlcoach", key, item)
        else:
            raise ConfigError(
                f"_internal_config key {key!r} (= {item!r}) has no rlcoach equivalent here; "
                "fix: remove it, or set the rlcoach field yourself — the engine in "
                "LocalBackend(engine={...}) (EngineConfig: max_model_len, "
                "gpu_memory_utilization, extra_args for any vLLM flag), the adapter in "
                "TrainConfig(lora={...}) (rank, alpha, dropout, target_modules), the step in "
                "TrainConfig (learning_rate, kl_coef, max_grad_norm, ...)"
            )
    if extra_args:
        result.engine["extra_args"] = extra_args
    return result


def train_options(value: Mapping[str, Any] | None) -> dict[str, Any]:
    """ART's per-step options — `model.train(_config=...)` (`art.dev.TrainConfig`) and
    `backend.train(model, groups, learning_rate=..., ...)` — as `TrainConfig` fields
    (`TrainConfig`'s own fields pass as they are)."""
    out: dict[str, Any] = {}
    for key, item in (value or {}).items():
        if key in TrainConfig.model_fields:
            out[key] = item
        elif key == "loss_fn" and item in _LOSS_FN:
            out["loss"] = _LOSS_FN[item]
        elif key in _STEP:
            if key == "logprob_calculation_chunk_size" and item < _MIN_CHUNK:
                logger.info(
                    "logprob_calculation_chunk_size=%s is below rlcoach's smallest chunk; "
                    "using %d tokens",
                    item,
                    _MIN_CHUNK,
                )
                item = _MIN_CHUNK
            out[_STEP[key]] = item
        elif key in _STEP_NO_EFFECT:
            logger.info("_config %s=%r needs nothing in rlcoach", key, item)
        else:
            known = ", ".join(sorted(_STEP))
            raise ConfigError(
                f"_config key {key!r} (= {item!r}) has no rlcoach equivalent; fix: remove it, "
                f"or set the TrainConfig field yourself (ART keys rlcoach maps: {known})"
            )
    return out
