"""Configuration: one small pydantic model per component, validated once.

Defaults run on a 2-core CPU with the bundled 135M model. Unknown fields are refused
(`extra="forbid"`), and a bad value raises `ConfigError` naming the field, the value,
the reason and the fix, however the config is built (`Config`, rlcoach.validation).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rlcoach.errors import ConfigError
from rlcoach.validation import Config, config_error

__all__ = [
    "Config",
    "EngineConfig",
    "LoraConfig",
    "SFTConfig",
    "TrainConfig",
    "check_name",
    "parse_config",
    "row_token_limit",
]

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")

AnyConfig = TypeVar("AnyConfig", bound=BaseModel)


def check_name(kind: str, value: object) -> str:
    """Check that a model or project name is one safe path component."""
    if not isinstance(value, str) or not _SAFE_NAME.fullmatch(value) or ".." in value:
        raise ConfigError(
            f"{kind} name {value!r} is not a safe path component: it becomes a folder under "
            "the run root and part of the served name `name@step`; fix: use 1-100 letters, "
            "digits, '.', '_' or '-', starting with a letter or digit (e.g. 'calc-agent')"
        )
    return value


def parse_config(cls: type[AnyConfig], value: AnyConfig | dict[str, Any] | None) -> AnyConfig:
    """`value` (a `cls`, a dict of its fields, or None for the defaults) as a `cls`;
    a bad value raises `ConfigError`, also for a model that is not a `Config`."""
    if isinstance(value, cls):
        return value
    try:
        return cls.model_validate(value or {})
    except ValidationError as e:
        raise config_error(cls, e) from e


class _Strict(Config):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LoraConfig(_Strict):
    """The LoRA adapter that training produces."""

    rank: int = Field(8, ge=1, le=256)
    """Adapter rank; the engine is started to accept up to `EngineConfig.max_lora_rank`."""
    alpha: int = Field(16, ge=1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] | Literal["auto", "all-linear"] = "auto"
    """Module names, peft's "all-linear", or "auto": the model family's attention and MLP
    projections (`rlcoach.models.families`), "all-linear" for an unlisted family."""


class TrainConfig(_Strict):
    """One GRPO step: objective, optimizer, batching."""

    learning_rate: float = Field(2e-4, gt=0.0, le=1.0)
    loss: Literal["grpo", "dr_grpo", "cispo"] = "grpo"
    """Token-level PPO-clip (`grpo`), Dr.GRPO normalisation, or CISPO (see objective.py)."""
    clip_low: float = Field(0.2, ge=0.0, le=1.0)
    clip_high: float = Field(0.28, ge=0.0, le=10.0)
    scale_rewards: bool = False
    """Divide advantages by the group's reward std (the GRPO paper) or not (Dr.GRPO)."""
    reward_coef: float = Field(1.0, ge=0.0)
    """Weight of the group-relative reward advantage; 0 with a teacher is pure on-policy
    distillation (docs/distillation.md)."""
    teacher_coef: float = Field(1.0, ge=0.0)
    """Weight of the teacher's per-token advantage, `teacher - sampler` log-prob (minus the
    reverse KL to the teacher), on tokens a `Teacher` scored; unused without one."""
    kl_coef: float = Field(0.0, ge=0.0)
    """Weight of the k3 KL estimate to the base model (0 skips the reference pass); ART's
    and TRL's `beta` is the same quantity and is accepted as an alias."""
    tis_cap: float | None = Field(None, ge=1.0)
    """Truncated importance sampling (Yao et al., 2025): weight each token's loss by
    `min(pi_trainer / pi_sampler, tis_cap)` and take the PPO ratio against the trainer's
    own log-probs (objective.py). None (default) is off; the paper uses 2."""
    mismatch_threshold: float = Field(0.2, gt=0.0)
    """A trained token whose |trainer - sampler| log-prob exceeds this counts in the
    step's `mismatch_beyond_fraction` (0.2: about the PPO clip range)."""
    mini_batches: int = Field(1, ge=1, le=1024)
    """Optimizer steps per batch of groups; 1 is one step per batch."""
    micro_batch_tokens: int = Field(1024, ge=64, le=1 << 20)
    """Tokens per forward/backward pass; sequences are packed up to this many (a longer
    sequence gets a row of its own, and longer sequences that share a prompt share it in
    rows of up to twice the longest: trainer/sequences.py). Attention inside a row costs
    its length squared, so rows only a little longer than typical sequences are fastest."""
    logprob_chunk_tokens: int = Field(1024, ge=16, le=1 << 20)
    """Tokens per chunk of the vocabulary projection (bounds the logits' memory)."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer in the backward pass instead of keeping its
    activations: far less memory for long rows (16K tokens) at about a third more compute."""
    compile_layers: bool = True
    """On a GPU, `torch.compile` each decoder layer and the vocabulary projection
    (element-wise chains fused into a few kernels; 35-45 s of compiling at the first
    step on the 4B shape). Ignored on the CPU."""
    fused_lora: bool = True
    """On a GPU, add each LoRA update inside the base matmul's epilogue instead of with
    two extra passes over the layer's output (trainer/fusion.py). Ignored on the CPU."""
    fused_logprob: bool = True
    """On a GPU, compute each token's log-prob gradient in the forward pass instead of
    recomputing the logits in the backward (trainer/fusion.py `TargetLogprob`): on an H100,
    4B shape, +4% tokens/s and less memory at the same loss (docs/benchmarks-gpu.md).
    Ignored on the CPU."""
    share_prefix: bool = True
    """Run a prompt prefix that several sequences share (a GRPO group's prompt) once per
    packed row, each sequence's remaining tokens attending to it, instead of once per
    sequence (trainer/sequences.py). Same loss and gradients up to rounding."""
    max_grad_norm: float = Field(1.0, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    max_staleness: int = Field(1, ge=0)
    """Policy versions a sample may lag the model it trains (staleness.py): a step from
    version k trains samples of versions k - max_staleness .. k and drops older ones
    (counted as `stale_dropped`). 1 lets the rollouts of step k+1 run while step k trains
    (pipeline.py); 0 is strictly on-policy."""
    lora: LoraConfig = Field(default_factory=LoraConfig)
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _beta_is_kl_coef(cls, data: Any) -> Any:
        # ART's TrainConfig(beta=...) and TRL's GRPOConfig(beta=...) weigh the same k3
        # estimate of the KL to the reference model, added per token to the loss.
        if isinstance(data, dict) and "beta" in data:
            data = dict(data)
            beta = data.pop("beta")
            if "kl_coef" in data and data["kl_coef"] != beta:
                raise ValueError(
                    f"beta={beta!r} and kl_coef={data['kl_coef']!r} name the same KL weight "
                    "with two values; fix: give one of them"
                )
            data["kl_coef"] = beta
        return data

    @property
    def beta(self) -> float:
        """`kl_coef` under ART's and TRL's name."""
        return self.kl_coef


def row_token_limit(max_tokens: int, longest: int, share_prefix: bool = True) -> int:
    """The most tokens a trainer's row holds when its sequences are at most `longest`
    tokens: `max_tokens` (`micro_batch_tokens`); a longer sequence is a row of its own,
    and longer sequences that share a prompt share it in rows of up to twice the longest
    (trainer/sequences.py). The GPU memory plan (runtime/memory.py) sizes the trainer's
    peak by this, with `longest` the engine's `max_model_len`."""
    if longest <= max_tokens:
        return max_tokens
    return 2 * longest if share_prefix else longest


class SFTConfig(_Strict):
    """Supervised fine-tuning (trainer/sft.py): epochs, batch, optimizer."""

    epochs: int = Field(1, ge=1, le=1000)
    batch_size: int = Field(8, ge=1, le=1 << 16)
    """Sequences per optimizer step."""
    learning_rate: float = Field(2e-4, gt=0.0, le=1.0)
    micro_batch_tokens: int = Field(1024, ge=64, le=1 << 20)
    max_grad_norm: float = Field(1.0, gt=0.0)
    seed: int = 0
    """Shuffles the sequences each epoch (a pure function of the seed and the epoch)."""


class PlacementConfig(Config):
    """GPU indices for serving and training; empty lists are derived (module docstring)."""

    model_config = ConfigDict(extra="forbid")

    serve_gpus: list[int] = Field(default_factory=list)
    train_gpus: list[int] = Field(default_factory=list)
    tensor_parallel: int | None = Field(None, ge=1)
    """vLLM tensor-parallel size; None: all serving GPUs divided by `data_parallel`."""
    data_parallel: int = Field(1, ge=1)
    """vLLM data-parallel replicas across the serving GPUs."""
    cpu_train_ranks: int = Field(0, ge=0, le=64)
    """Train on this many CPU ranks (torchrun, gloo, FSDP2) where no GPU is visible; 0 or
    1: the single-process trainer. For testing the distributed trainer without GPUs."""


class EngineConfig(_Strict):
    """The inference engine behind the policy endpoint."""

    kind: Literal["vllm", "transformers", "transformers-process"] = "vllm"
    """vLLM (a supervised subprocess), transformers in this process, or transformers in a
    supervised subprocess of its own (`engines/transformers_process.py`)."""
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)
    """Port of the policy endpoint (the gateway); 0 picks a free one."""
    max_model_len: int = Field(4096, ge=128)
    max_loras: int = Field(2, ge=1)
    """Adapters the engine holds at once (two: in-flight requests finish on the old one)."""
    max_lora_rank: int = Field(16, ge=1)
    """Largest LoRA rank the engine serves; a model whose rank is larger is refused when
    it registers (every publish would fail)."""
    max_recorded_rollouts: int = Field(10_000, ge=1)
    """Rollouts whose exchanges the policy endpoint holds until they are taken; the least
    recently used goes first (counted in `rlcoach serve`'s /metrics)."""
    recording_ttl_s: float = Field(3600.0, gt=0.0)
    """A rollout's exchanges not taken within this long of its last call are dropped."""
    adapter_wait_timeout_s: float = Field(120.0, gt=0.0)
    """Longest wait for an adapter slot while every loaded adapter serves requests."""
    kv_cache_gib: int = Field(2, ge=1)
    """KV cache size on the CPU in whole GiB (`VLLM_CPU_KVCACHE_SPACE` takes an integer)."""
    gpu_memory_utilization: float = Field(0.85, gt=0.0, le=1.0)
    """The share of the serving GPU's memory vLLM takes (weights, activations, KV cache).
    Colocated on one GPU it is what the trainer does not get (`colocation`)."""
    colocation: Literal["split", "sleep"] = "split"
    """How vLLM and the trainer share one GPU (colocation.py): "split" keeps both
    resident, vLLM in `gpu_memory_utilization` and the trainer in the rest, so rollouts
    and training can overlap; "sleep" puts vLLM to sleep around each training step
    (weights offloaded to CPU memory, KV cache freed) so the trainer gets nearly the
    whole GPU, and rollouts wait while it trains. GPU only: vLLM has no sleep mode on
    the CPU."""
    tool_call_parser: str | None = None
    """vLLM tool parser; None: the model family's (`rlcoach.models.families`), else "hermes"."""
    reasoning_parser: str | None = None
    """vLLM reasoning parser; None: the model family's (Qwen3: "qwen3"); "none": off."""
    chat_template: Path | None = None
    """A Jinja chat template file; None uses the model folder's own."""
    extra_args: list[str] = Field(default_factory=list)
    """More `vllm serve` arguments, passed as they are."""
    startup_timeout_s: float = Field(600.0, gt=0.0)
    request_timeout_s: float = Field(600.0, gt=0.0)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """Weights' dtype in the engine; "auto": the checkpoint's, but float32 on a CPU without
    fast bf16 (`rlcoach.runtime.hardware`)."""
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    """Which GPUs serve and which train (`rlcoach.runtime.placement`); derived when left empty."""

    @model_validator(mode="after")
    def _template_exists(self) -> EngineConfig:
        if self.chat_template is not None and not Path(self.chat_template).is_file():
            raise ValueError(
                f"chat template file {str(self.chat_template)!r} does not exist; fix: "
                "point chat_template at a Jinja file, or leave it None for the model's own"
            )
        return self
