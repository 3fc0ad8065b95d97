"""The LoRA step: one optimizer step per batch of scored groups, on torch + peft.

Flow of `LoraTrainer.step`: group advantages (zero-variance groups dropped and counted)
→ exact-token sequences → packed rows of at most `micro_batch_tokens` → for each
mini-batch, forward/backward every row (gradients accumulate), clip, one AdamW step.
The loss of every row is divided by the normaliser of its whole mini-batch, so
micro-batching changes nothing but memory. Log-probs are computed by projecting the
final hidden states onto the vocabulary `logprob_chunk_tokens` at a time under
activation checkpointing, so no [tokens x vocab] tensor lives for the whole row.

Attention inside a packed row is per sequence (`attention.py`): the row is cut at the
sequence boundaries and each piece runs causal sdpa with no mask (FlashAttention on a
GPU), so no [T x T] mask is built. `activation_checkpointing` recomputes each decoder
layer in the backward pass instead of keeping its activations (less memory, about a
third more compute). On a GPU each decoder layer is also compiled and each LoRA update is
fused into its base matmul (`fusion.py`; `compile_layers`, `fused_lora`).

On the CPU the weights stay fp32 and the step runs under bf16 autocast where the CPU has
bf16 instructions (about twice as fast as plain fp32), in plain fp32 where it has not
(hardware.py: the fallback bf16 kernel is hundreds of times slower). On a GPU the base
weights are bf16, and peft keeps the LoRA weights (and so AdamW's state) in fp32 while
autocast runs their matmuls in bf16. The reference model for the KL term is the same
model with the adapter disabled: no second copy.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from rlcoach.config import TrainConfig
from rlcoach.families import lora_targets
from rlcoach.hardware import fast_bf16
from rlcoach.trainer.attention import (
    SEGMENT_ATTENTION,
    register_segment_attention,
    segment_bounds,
)
from rlcoach.trainer.fusion import (
    compile_decoder_layers,
    compiled_target_logprob,
    fuse_lora_linears,
)
from rlcoach.trainer.objective import (
    LossTerms,
    group_advantages,
    loss_normalizer,
    policy_loss,
)
from rlcoach.trainer.sequences import PackedRow, TrainSequence, build_sequences, pack_sequences
from rlcoach.types import TrajectoryGroup

__all__ = [
    "LoraTrainer",
    "StepStats",
    "build_lora_model",
    "build_optimizer",
    "chunked_token_logprobs",
    "collect_sequences",
    "row_loss_terms",
    "untrained_stats",
]

logger = logging.getLogger(__name__)

OPTIMIZER_FILE = "optimizer.pt"


@dataclass(frozen=True, slots=True)
class StepStats:
    """What one step did (plain numbers, ready for a metrics sink)."""

    trained: bool
    groups: int
    groups_skipped_no_variance: int
    trajectories: int
    sequences: int
    sampled_tokens: int
    total_tokens: int
    loss: float
    grad_norm: float
    clip_fraction: float
    kl: float
    mean_ratio: float
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def _project(lm_head: torch.nn.Module, h_CH: torch.Tensor, t_C: torch.Tensor) -> torch.Tensor:
    """Log-prob of the targets `t_C` under the logits of `h_CH` (fp32, shape [C])."""
    logits_CV = lm_head(h_CH).float()
    return logits_CV.gather(-1, t_C[:, None])[:, 0] - torch.logsumexp(logits_CV, dim=-1)


@functools.cache
def _compiled_project() -> Any:
    # Inductor reads the bf16 logits once per pass and never writes an fp32 copy of them
    # (eager: a [C x vocab] fp32 cast, then log-sum-exp and its backward over it).
    return torch.compile(_project, dynamic=True)


def chunked_token_logprobs(
    causal_lm: Any,
    input_ids_1T: torch.Tensor,
    position_ids_1T: torch.Tensor,
    chunk: int,
    compiled: bool = False,
    fused_logprob: bool = False,
) -> torch.Tensor:
    """Log-prob of each token given the ones before it, shape [T-1] (fp32).

    `compiled` runs the vocabulary projection through `torch.compile`; `fused_logprob`
    uses the compiled `TargetLogprob` of fusion.py instead where the output layer is a
    frozen bias-free linear (the trainer sets them on a GPU only)."""
    backbone = causal_lm.get_decoder() if hasattr(causal_lm, "get_decoder") else causal_lm.model
    lm_head = causal_lm.get_output_embeddings()
    if getattr(causal_lm.config, "_attn_implementation", None) == SEGMENT_ATTENTION:
        # Per-sequence attention: boundaries instead of a mask (see attention.py).
        hidden_1TH = backbone(
            input_ids=input_ids_1T,
            position_ids=position_ids_1T,
            rlcoach_segments=torch.tensor(segment_bounds(position_ids_1T[0])),
        ).last_hidden_state
    else:
        # Any other attention: a block-diagonal causal mask, with a new block wherever
        # the position ids restart at 0 (sdpa ignores position-id resets).
        segments_T = torch.cumsum(position_ids_1T[0] == 0, dim=0)
        length = segments_T.shape[0]
        causal_TT = torch.ones(length, length, dtype=torch.bool, device=segments_T.device).tril()
        mask_11TT = (causal_TT & (segments_T[:, None] == segments_T[None, :]))[None, None]
        hidden_1TH = backbone(
            input_ids=input_ids_1T, position_ids=position_ids_1T, attention_mask=mask_11TT
        ).last_hidden_state
    hidden_TH = hidden_1TH[0, :-1]
    targets_T = input_ids_1T[0, 1:]

    fused = (
        fused_logprob
        and type(lm_head) is torch.nn.Linear
        and lm_head.bias is None
        and not lm_head.weight.requires_grad
    )
    project = functools.partial(_compiled_project() if compiled else _project, lm_head)
    pieces = []
    for start in range(0, hidden_TH.shape[0], chunk):
        h_CH, t_C = hidden_TH[start : start + chunk], targets_T[start : start + chunk]
        if fused:  # no checkpoint: only a [C x hidden] tensor is kept for the backward
            pieces.append(compiled_target_logprob()(h_CH, lm_head.weight, t_C))
        elif torch.is_grad_enabled():
            pieces.append(checkpoint(project, h_CH, t_C, use_reentrant=False))
        else:
            pieces.append(project(h_CH, t_C))
    return torch.cat(pieces)


def build_lora_model(model_path: str | Path, config: TrainConfig, device: torch.device) -> Any:
    """The base causal LM on `device` with a fresh LoRA adapter (seeded by `config.seed`,
    so every process that builds it gets the same initial adapter)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # kernels and memory stats on the placed GPU
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(config.seed)
    register_segment_attention()
    base = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=dtype, attn_implementation=SEGMENT_ATTENTION
    ).to(device)
    base.config.use_cache = False
    if config.activation_checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = config.lora
    # peft keeps the adapter in fp32 over bf16 base weights (autocast_adapter_dtype).
    model = get_peft_model(
        base,
        LoraConfig(
            r=lora.rank,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=lora_targets(lora.target_modules, model_path),
            task_type="CAUSAL_LM",
        ),
    )
    if device.type == "cuda":
        # peft casts each LoRA layer's input to the adapter's fp32 before autocast
        # casts it back to bf16 for the matmul: two full passes over the activations
        # per LoRA layer for nothing, since the step always runs under autocast.
        for module in model.modules():
            if hasattr(module, "lora_A"):
                module.cast_input_dtype_enabled = False
        # GPU only (fusion.py): on the CPU inductor's compiling costs more than it saves.
        if config.fused_lora:
            fuse_lora_linears(model)
        if config.compile_layers:
            compile_decoder_layers(base)
    return model


def build_optimizer(model: Any, config: TrainConfig, fused: bool) -> torch.optim.AdamW:
    """AdamW over the model's trainable (LoRA) parameters, in `named_parameters` order."""
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
        fused=fused,
    )


def collect_sequences(
    groups: list[TrajectoryGroup], config: TrainConfig
) -> tuple[list[TrainSequence], int, int]:
    """The training sequences of `groups`, the groups skipped for having no reward
    variance, and the trajectories trained on."""
    sequences: list[TrainSequence] = []
    skipped = 0
    trajectories = 0
    for group in groups:
        if not group.trajectories:
            continue
        rewards_G = torch.tensor(group.rewards, dtype=torch.float32)
        advantages_G = group_advantages(rewards_G, config.scale_rewards)
        # Sequences are built even for skipped groups: bad data fails loudly either way.
        built = [
            build_sequences(t, float(a))
            for t, a in zip(group.trajectories, advantages_G, strict=True)
        ]
        if torch.all(advantages_G.abs() < 1e-8):
            skipped += 1
            continue
        trajectories += len(group.trajectories)
        sequences += [s for per_trajectory in built for s in per_trajectory]
    return sequences, skipped, trajectories


def untrained_stats(groups: int, skipped: int, started: float) -> StepStats:
    """The stats of a step that trained nothing: no group had reward variance."""
    return StepStats(
        False, groups, skipped, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 1.0, time.perf_counter() - started
    )


def row_loss_terms(
    trainer: Any, row: PackedRow, normalizer: float, config: TrainConfig
) -> LossTerms:
    """The policy loss of one packed row under `trainer.row_logprobs` (and its reference
    pass when the KL term is on)."""
    device = trainer.device
    ref = trainer.row_logprobs(row, use_adapter=False) if config.kl_coef > 0 else None
    new_T = trainer.row_logprobs(row)
    return policy_loss(
        new_T,
        row.old_logprobs_T[1:].to(device),
        row.advantages_T[1:].to(device),
        row.sampled_mask_T[1:].to(device),
        normalizer=normalizer,
        kind=config.loss,
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        ref_logprobs_T=ref,
        kl_coef=config.kl_coef,
    )


class LoraTrainer:
    """A causal LM with a peft LoRA adapter and its optimizer."""

    def __init__(
        self, model_path: str | Path, config: TrainConfig, device: str | None = None
    ) -> None:
        self.config = config
        default = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device or default)
        self.model = build_lora_model(model_path, config, self.device)
        self.optimizer = build_optimizer(self.model, config, fused=self.device.type == "cuda")

    def _autocast(self) -> Any:
        # Off where bf16 matmuls are slow (an AVX2-only CPU): see hardware.py.
        return torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=fast_bf16(self.device)
        )

    def row_logprobs(self, row: PackedRow, use_adapter: bool = True) -> torch.Tensor:
        ids = row.input_ids_T[None].to(self.device)
        positions = row.position_ids_T[None].to(self.device)
        causal_lm = self.model.get_base_model()
        gpu = self.device.type == "cuda"
        options = {
            "chunk": self.config.logprob_chunk_tokens,
            "compiled": self.config.compile_layers and gpu,
            "fused_logprob": self.config.fused_logprob and gpu,
        }
        with self._autocast():
            if use_adapter:
                return chunked_token_logprobs(causal_lm, ids, positions, **options)
            with self.model.disable_adapter(), torch.no_grad():
                return chunked_token_logprobs(causal_lm, ids, positions, **options)

    def step(self, groups: list[TrajectoryGroup], config: TrainConfig | None = None) -> StepStats:
        """Train on `groups`; returns stats (`trained=False` when no group had variance)."""
        c = config or self.config
        for group in self.optimizer.param_groups:
            group["lr"] = c.learning_rate
        started = time.perf_counter()
        sequences, skipped, trajectories = collect_sequences(groups, c)
        if not sequences:
            return untrained_stats(len(groups), skipped, started)
        self.model.train()
        mini_batches = [sequences[i :: c.mini_batches] for i in range(c.mini_batches)]
        losses, norms = [], []
        clipped = kl = ratio = 0.0
        for part in (p for p in mini_batches if p):
            normalizer = loss_normalizer(c.loss, [s.sampled_tokens for s in part])
            self.optimizer.zero_grad(set_to_none=True)
            part_loss = 0.0
            for row in pack_sequences(part, c.micro_batch_tokens):
                terms = row_loss_terms(self, row, normalizer, c)
                terms.loss.backward()
                part_loss += float(terms.loss.detach())
                clipped += float(terms.clipped_tokens.detach())
                kl += float(terms.kl_sum.detach())
                ratio += float(terms.ratio_sum.detach())
            params = [p for p in self.model.parameters() if p.requires_grad]
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, c.max_grad_norm)))
            self.optimizer.step()
            losses.append(part_loss)
        self.model.eval()
        sampled = sum(s.sampled_tokens for s in sequences)
        return StepStats(
            trained=True,
            groups=len(groups),
            groups_skipped_no_variance=skipped,
            trajectories=trajectories,
            sequences=len(sequences),
            sampled_tokens=sampled,
            total_tokens=sum(len(s.token_ids) for s in sequences),
            loss=sum(losses) / len(losses),
            grad_norm=sum(norms) / len(norms),
            clip_fraction=clipped / sampled,
            kl=kl / sampled,
            mean_ratio=ratio / sampled,
            seconds=time.perf_counter() - started,
        )

    def save(self, folder: Path) -> None:
        """Write the peft adapter (loadable by vLLM and transformers) and optimizer state."""
        self.save_adapter(folder)
        self.save_optimizer(folder)

    def save_adapter(self, folder: Path) -> None:
        """Write only the adapter: all an engine needs to serve the new weights."""
        self.model.save_pretrained(folder)

    def save_optimizer(self, folder: Path) -> None:
        """Write AdamW's state (twice the adapter's size) atomically into `folder`."""
        temp = folder / f".{OPTIMIZER_FILE}.tmp"
        torch.save(self.optimizer.state_dict(), temp)
        temp.replace(folder / OPTIMIZER_FILE)

    def load(self, folder: Path) -> None:
        """Resume adapter weights and optimizer state from a checkpoint folder."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        weights = load_file(str(folder / "adapter_model.safetensors"), device=str(self.device))
        result = set_peft_model_state_dict(self.model, weights)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise ValueError(f"checkpoint {folder} does not fit this model: {unexpected[:3]}")
        optimizer_file = folder / OPTIMIZER_FILE
        if optimizer_file.exists():
            self.optimizer.load_state_dict(torch.load(optimizer_file, map_location=self.device))
        else:  # written after publishing: a crash in between leaves the adapter alone
            logger.warning("checkpoint %s has no optimizer state; AdamW starts afresh", folder)
