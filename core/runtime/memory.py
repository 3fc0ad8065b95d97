"""GPU memory: will the chosen placement and colocation fit, before anything loads?

A GPU that cannot hold the engine and the trainer should fail when the model is
registered, with the memory it needs and a setting that would fit, not with an
out-of-memory error in the middle of a step an hour later. `plan_memory` estimates, from
the model's `config.json` alone:

- weights: every parameter in bf16, once in vLLM and once in the trainer;
- LoRA: the adapter in fp32 with its gradient and AdamW's two moments (16 bytes a
  parameter), and vLLM's adapter slots (`max_loras` x `max_lora_rank`, bf16);
- activations per token of the largest row the trainer builds (`row_token_limit`:
  `TrainConfig.micro_batch_tokens`, or where `max_model_len` is longer, one sequence of
  that length, twice that when long sequences share their prompt): what one decoder
  layer keeps for the backward, in bf16, for every layer (only the layer inputs plus one
  layer's worth with `activation_checkpointing`), plus the vocabulary projection of one
  `logprob_chunk_tokens` chunk in fp32;
- vLLM: its weights, adapter slots, a fixed allowance for activations and CUDA graphs,
  and a KV cache of at least one `max_model_len` sequence (vLLM refuses to start with
  less), all inside its `gpu_memory_utilization` share, though its process holds a
  measured allowance beyond it; while asleep (colocation.py) it keeps only the allowance
  for its CUDA context and graphs;
- a CUDA context per process.

The coefficients are estimates (`ACTIVATION_ELEMENTS`, `VLLM_OVERHEAD_BYTES`, ...), set
from the published Qwen3 shapes and checked against the peaks that bench/gpu/step.py
prints beside them; they err on the generous side, so a refusal means a real risk.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlcoach.config import row_token_limit
from rlcoach.errors import ConfigError

if TYPE_CHECKING:
    from rlcoach.config import EngineConfig, TrainConfig
    from rlcoach.runtime.placement import Placement

__all__ = ["MemoryPlan", "ModelShape", "check_gpu_memory", "check_memory", "plan_memory"]

logger = logging.getLogger(__name__)

GiB = 1024**3
CUDA_CONTEXT_BYTES = int(0.75 * GiB)
"""A process's CUDA context and library workspaces (cuBLAS, NCCL) before any tensor."""
VLLM_OVERHEAD_BYTES = int(3.0 * GiB)
"""vLLM beyond weights and KV cache: profiled activations, sampler buffers, CUDA graphs."""
VLLM_ASLEEP_BYTES = int(1.5 * GiB)
"""What a sleeping vLLM (level 1) keeps: its context and CUDA graph pool."""
VLLM_BEYOND_SHARE_BYTES = int(2.75 * GiB)
"""What vLLM's process holds beyond `gpu_memory_utilization` x the GPU (its CUDA context
and what it allocates outside the share): measured 2.65 GiB on an H100 with vLLM 0.26 and
CUDA graphs (34.35 GiB in use at a 0.4 share of 79.2 GiB), where a trainer estimated to
fit in the rest ran out of memory (docs/benchmarks-gpu.md)."""
ACTIVATION_ELEMENTS = (14, 1, 1, 4)
"""bf16 elements one decoder layer keeps per token for the backward, as multiples of
(hidden, attention width heads x head_dim, key/value width, MLP width). Fitted to the
eager peaks of docs/benchmarks-gpu.md (Qwen3-4B and 8B shapes in rows of 4K tokens:
31.1 and 47.7 GiB; with checkpointing at 16K tokens 14.7 and 23.7 GiB, which the
estimate exceeds by 1-3 GiB): the hidden-sized terms are many because RMSNorm keeps
fp32 copies and every LoRA keeps its input. For eager layers (`compile_layers=False`)."""
COMPILED_ACTIVATION_ELEMENTS = (6, 2, 2, 3)
"""The same for compiled decoder layers with fused LoRA (`compile_layers`, the GPU
default), which keep far fewer intermediates. Fitted to the peaks measured on an H100 and
an H200 with the defaults (Qwen3-4B shape; docs/benchmarks-gpu.md): in the RL loop, 41.6
and 47.1 GiB (the process's whole use) for rows of 7.6K and 8.7K tokens (14 and 16
sequences of ~515), 42.4 and 75.0 GiB for 2 and 4 sequences of 4K tokens; the estimate
is 0-6% above each; the trainer alone peaks lower (24.5 and 38.9 GiB at 4.1K and 8.2K
tokens; 14-16% above) (`tests/unit/test_memory.py`). The eager coefficients above were
1.7x the measured peak of 16 short sequences, which refused the faster setting beside
vLLM."""
LOGIT_BYTES_PER_ELEMENT = 10
"""The chunked vocabulary projection: bf16 logits, their fp32 copy and its gradient."""
MARGIN = 1.15
"""Allocator fragmentation and what the estimate misses (1.1 left the RL loop's peak at
16 sequences a pass 1 GiB above the estimate once rows were filled to ~98%)."""


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The sizes of a decoder-only transformer that memory depends on."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        """From a `config.json` (a multimodal config's `text_config` when it has one)."""
        text = config.get("text_config") or config
        try:
            heads = int(text["num_attention_heads"])
            hidden = int(text["hidden_size"])
            return cls(
                layers=int(text["num_hidden_layers"]),
                hidden=hidden,
                intermediate=int(text["intermediate_size"]),
                heads=heads,
                kv_heads=int(text.get("num_key_value_heads") or heads),
                head_dim=int(text.get("head_dim") or hidden // heads),
                vocab=int(text["vocab_size"]),
                tied_embeddings=bool(
                    config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
                ),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(
                f"the model config lacks {e} needed to estimate GPU memory; fix: use a "
                "decoder-only transformer folder whose config.json has hidden_size, "
                "num_hidden_layers, num_attention_heads, intermediate_size and vocab_size"
            ) from e

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelShape:
        return cls.from_config(json.loads((Path(folder) / "config.json").read_text()))

    @property
    def attention_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each projection of one decoder layer."""
        h, a, kv, i = self.hidden, self.attention_width, self.kv_width, self.intermediate
        return {
            "q_proj": (h, a),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (a, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def params(self) -> int:
        per_layer = sum(n * m for n, m in self.linear_shapes().values()) + 2 * self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * per_layer + embeddings + self.hidden

    def lora_params(self, rank: int) -> int:
        """An adapter of `rank` on every projection of every layer (the most it covers)."""
        return self.layers * rank * sum(n + m for n, m in self.linear_shapes().values())

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_width * 2

    def activation_bytes_per_token(self, checkpointing: bool, compiled: bool = False) -> int:
        c_h, c_a, c_kv, c_i = COMPILED_ACTIVATION_ELEMENTS if compiled else ACTIVATION_ELEMENTS
        layer = 2 * (
            c_h * self.hidden
            + c_a * self.attention_width
            + c_kv * self.kv_width
            + c_i * self.intermediate
        )
        if checkpointing:  # each layer's input kept, one layer recomputed at a time
            return self.layers * 2 * self.hidden + layer
        return self.layers * layer


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Estimated bytes on each GPU, and whether they fit."""

    colocation: str
    """"split", "sleep", or "dedicated" (serving and training on different GPUs)."""
    gpu_bytes: int
    engine_bytes: int
    """vLLM's share: `gpu_memory_utilization` x the serving GPU (its process holds
    `VLLM_BEYOND_SHARE_BYTES` more)."""
    engine_need_bytes: int
    """What vLLM needs at least: weights, adapter slots, overhead, one sequence's KV."""
    trainer_resident_bytes: int
    """What the trainer keeps between steps: weights, adapter, gradient, AdamW state."""
    trainer_peak_bytes: int
    """The trainer at its peak inside a step."""
    kv_cache_tokens: int
    """KV cache vLLM would have for rollouts, in tokens (all sequences together)."""
    problems: tuple[str, ...]
    """Why it does not fit (empty: it fits)."""

    @property
    def fits(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__slots__}
        data["fits"] = self.fits
        return data


def _gib(value: float) -> str:
    return f"{value / GiB:.1f} GiB"


def _trainer_bytes(
    shape: ModelShape,
    lora_rank: int,
    row_tokens: int,
    logprob_chunk_tokens: int,
    checkpointing: bool,
    compiled: bool,
) -> tuple[int, int]:
    resident = shape.params * 2 + shape.lora_params(lora_rank) * 16 + CUDA_CONTEXT_BYTES
    activations = row_tokens * shape.activation_bytes_per_token(checkpointing, compiled)
    logits = min(logprob_chunk_tokens, row_tokens) * shape.vocab * LOGIT_BYTES_PER_ELEMENT
    return resident, int(resident + MARGIN * (activations + logits))


def plan_memory(
    shape: ModelShape,
    *,
    gpu_bytes: int,
    colocation: str,
    gpu_memory_utilization: float,
    max_model_len: int,
    max_loras: int,
    max_lora_rank: int,
    lora_rank: int,
    micro_batch_tokens: int,
    logprob_chunk_tokens: int,
    activation_checkpointing: bool,
    train_gpu_bytes: int | None = None,
    compiled_layers: bool = False,
    share_prefix: bool = True,
) -> MemoryPlan:
    """Estimate one placement (see the module docstring). `colocation` is "split" or
    "sleep" for one shared GPU, "dedicated" when the trainer has its own
    (`train_gpu_bytes`, default the same size). `compiled_layers`: the trainer's
    decoder layers are compiled (`TrainConfig.compile_layers` on a GPU)."""
    engine_fixed = (
        shape.params * 2
        + max_loras * shape.lora_params(max_lora_rank) * 2
        + VLLM_OVERHEAD_BYTES
        + CUDA_CONTEXT_BYTES
    )
    engine_need = engine_fixed + max_model_len * shape.kv_bytes_per_token()
    engine_bytes = int(gpu_memory_utilization * gpu_bytes)
    row_tokens = row_token_limit(micro_batch_tokens, max_model_len, share_prefix)
    resident, peak = _trainer_bytes(
        shape,
        lora_rank,
        row_tokens,
        logprob_chunk_tokens,
        activation_checkpointing,
        compiled_layers,
    )
    problems = []
    if engine_bytes < engine_need:
        problems.append(
            f"vLLM gets {_gib(engine_bytes)} (gpu_memory_utilization={gpu_memory_utilization} "
            f"of {_gib(gpu_bytes)}) but needs {_gib(engine_need)} (weights, adapters, "
            f"overhead and one {max_model_len}-token sequence of KV cache)"
        )
    if colocation == "split":
        trainer_room = gpu_bytes - engine_bytes - VLLM_BEYOND_SHARE_BYTES
        if peak > trainer_room:
            problems.append(
                f"the trainer needs {_gib(peak)} at its peak (rows of up to {row_tokens} "
                f"tokens) but gets {_gib(trainer_room)} beside vLLM"
            )
    elif colocation == "sleep":
        awake = engine_bytes + VLLM_BEYOND_SHARE_BYTES
        if resident + awake > gpu_bytes:
            problems.append(
                f"awake, vLLM's {_gib(awake)} and the trainer's resident {_gib(resident)} "
                f"exceed the GPU's {_gib(gpu_bytes)}"
            )
        if peak + VLLM_ASLEEP_BYTES > gpu_bytes:
            problems.append(
                f"the trainer needs {_gib(peak)} at its peak (rows of up to {row_tokens} "
                f"tokens) beside a sleeping vLLM's {_gib(VLLM_ASLEEP_BYTES)}, more than the "
                f"GPU's {_gib(gpu_bytes)}"
            )
    else:
        train_gpu = train_gpu_bytes or gpu_bytes
        if peak > train_gpu:
            problems.append(
                f"the trainer needs {_gib(peak)} at its peak (rows of up to {row_tokens} "
                f"tokens) but its GPU has {_gib(train_gpu)}"
            )
    kv_tokens = max((engine_bytes - engine_fixed) // shape.kv_bytes_per_token(), 0)
    return MemoryPlan(
        colocation=colocation,
        gpu_bytes=gpu_bytes,
        engine_bytes=engine_bytes,
        engine_need_bytes=engine_need,
        trainer_resident_bytes=resident,
        trainer_peak_bytes=peak,
        kv_cache_tokens=int(kv_tokens),
        problems=tuple(problems),
    )


def _what_fits(base: dict[str, Any], shape: ModelShape) -> list[str]:
    """Up to three settings that would make a plan fit, the cheapest kinds of change
    first: the other colocation, checkpointing, vLLM's share, then pairs of those, and a
    smaller micro-batch or, where the longest sequences set the rows, shorter ones (slowest:
    more passes per step, or less context) last."""
    utils = [u / 100 for u in range(95, 4, -5)]
    colocations: list[tuple[str, dict[str, Any]]] = []
    if (other := {"split": "sleep", "sleep": "split"}.get(base["colocation"])) is not None:
        colocations = [(f"colocation='{other}'", {"colocation": other})] + [
            (
                f"colocation='{other}' with gpu_memory_utilization={u}",
                {"colocation": other, "gpu_memory_utilization": u},
            )
            for u in utils
        ]
    checkpointing: list[tuple[str, dict[str, Any]]] = []
    if not base["activation_checkpointing"]:
        checkpointing = [
            ("TrainConfig(activation_checkpointing=True)", {"activation_checkpointing": True})
        ]
    shares = [(f"gpu_memory_utilization={u}", {"gpu_memory_utilization": u}) for u in utils]
    batches: list[tuple[str, dict[str, Any]]] = []
    if base["max_model_len"] <= base["micro_batch_tokens"]:
        tokens = base["micro_batch_tokens"] // 2
        while tokens >= 256:
            batches.append(
                (f"TrainConfig(micro_batch_tokens={tokens})", {"micro_batch_tokens": tokens})
            )
            tokens //= 2
    else:  # the longest sequences set the rows (row_token_limit), not micro_batch_tokens
        if base.get("share_prefix", True):
            batches.append(("TrainConfig(share_prefix=False)", {"share_prefix": False}))
        length = base["max_model_len"] // 2
        while length >= max(base["micro_batch_tokens"], 256):
            batches.append((f"EngineConfig(max_model_len={length})", {"max_model_len": length}))
            length //= 2
    ranked = [
        [colocations],
        [checkpointing],
        [shares],
        [colocations, checkpointing],
        [shares, checkpointing],
        [batches],
        [colocations, batches],
        [shares, batches],
    ]
    fixes: list[str] = []
    for groups in ranked:
        if len(groups) == 1:
            candidates = [([text], change) for text, change in groups[0]]
        else:
            candidates = [([t1, t2], {**c1, **c2}) for t1, c1 in groups[0] for t2, c2 in groups[1]]
        for texts, change in candidates:
            if plan_memory(shape, **{**base, **change}).fits:
                fixes.append(" with ".join(texts))
                break
        if len(fixes) == 3:
            break
    return fixes or ["a smaller model, or a GPU with more memory"]


def check_memory(
    shape: ModelShape,
    *,
    gpu_bytes: int,
    colocation: str,
    train_gpu_bytes: int | None = None,
    **settings: Any,
) -> MemoryPlan:
    """`plan_memory`, raising `ConfigError` with the needs and the fixes when it does not
    fit (called when a model is registered on a GPU)."""
    base = {"gpu_bytes": gpu_bytes, "colocation": colocation, **settings}
    if train_gpu_bytes is not None:
        base["train_gpu_bytes"] = train_gpu_bytes
    plan = plan_memory(shape, **base)
    if plan.fits:
        return plan
    fixes = _what_fits(base, shape)
    raise ConfigError(
        f"this GPU cannot hold the engine and the trainer as configured "
        f"(colocation={colocation!r}, estimated from the model's config): "
        + "; ".join(plan.problems)
        + f". Needs: vLLM {_gib(plan.engine_need_bytes)}, trainer {_gib(plan.trainer_peak_bytes)}"
        f" at its peak ({_gib(plan.trainer_resident_bytes)} resident). Fix: " + " or ".join(fixes)
    )


def check_gpu_memory(
    model_folder: str | Path,
    engine: EngineConfig,
    train: TrainConfig,
    placement: Placement | None,
) -> MemoryPlan | None:
    """`check_memory` for a vLLM engine about to start with this placement (None where
    nothing is checked: no GPU, or several serving or training GPUs, whose sharding the
    estimate does not model)."""
    if placement is None or len(placement.serve_gpus) != 1 or len(placement.train_gpus) != 1:
        return None
    import torch

    serve, trainer = placement.serve_gpus[0], placement.train_gpus[0]
    plan = check_memory(
        ModelShape.from_folder(model_folder),
        gpu_bytes=torch.cuda.get_device_properties(serve).total_memory,
        train_gpu_bytes=torch.cuda.get_device_properties(trainer).total_memory,
        colocation=engine.colocation if serve == trainer else "dedicated",
        gpu_memory_utilization=engine.gpu_memory_utilization,
        max_model_len=engine.max_model_len,
        max_loras=engine.max_loras,
        max_lora_rank=engine.max_lora_rank,
        lora_rank=train.lora.rank,
        micro_batch_tokens=train.micro_batch_tokens,
        logprob_chunk_tokens=train.logprob_chunk_tokens,
        activation_checkpointing=train.activation_checkpointing,
        compiled_layers=train.compile_layers,
        share_prefix=train.share_prefix,
    )
    logger.info(
        "GPU memory plan (%s): vLLM %.1f GiB of which KV cache for %d tokens; trainer peak "
        "%.1f GiB",
        plan.colocation,
        plan.engine_bytes / GiB,
        plan.kv_cache_tokens,
        plan.trainer_peak_bytes / GiB,
    )
    return plan
