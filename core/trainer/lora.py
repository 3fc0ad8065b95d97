"""The single-process LoRA trainer: a causal LM with a peft adapter, on torch + peft.

`LoraTrainer.step` is the GRPO step of step.py (written once, also run by the torchrun
ranks of ranks.py) over rows of at most `micro_batch_tokens`, all run by this process;
`load` is the loader of checkpoint.py. Log-probs are computed by projecting the
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

import copy
import functools
import itertools
from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from rlcoach.config import TrainConfig
from rlcoach.models.families import lora_targets
from rlcoach.runtime.hardware import autocast, upload
from rlcoach.trainer.attention import (
    SEGMENT_ATTENTION,
    register_segment_attention,
    segment_bounds,
)
from rlcoach.trainer.base import StepStats
from rlcoach.trainer.checkpoint import load_checkpoint, save_optimizer_state
from rlcoach.trainer.fusion import (
    compile_decoder_layers,
    compiled_target_logprob,
    fuse_lora_linears,
)
from rlcoach.trainer.sequences import (
    PackedRow,
    Segment,
    TrainSequence,
    pack_sequences,
    pack_shared,
    share_prefixes,
)
from rlcoach.trainer.step import grpo_step
from rlcoach.trajectory.trajectories import TrajectoryGroup

__all__ = [
    "LoraTrainer",
    "build_lora_model",
    "build_optimizer",
    "chunked_token_logprobs",
    "serving_dtype",
]


def _project(lm_head: torch.nn.Module, h_CH: torch.Tensor, t_C: torch.Tensor) -> torch.Tensor:
    """Log-prob of the targets `t_C` under the logits of `h_CH` (fp32, shape [C])."""
    logits_CV = lm_head(h_CH).float()
    return logits_CV.gather(-1, t_C[:, None])[:, 0] - torch.logsumexp(logits_CV, dim=-1)


@functools.cache
def _compiled_project() -> Any:
    # Inductor reads the bf16 logits once per pass and never writes an fp32 copy of them
    # (eager: a [C x vocab] fp32 cast, then log-sum-exp and its backward over it).
    return torch.compile(_project, dynamic=True)


def _plain_segments(position_ids_T: torch.Tensor) -> tuple[Segment, ...]:
    """One piece per sequence of a row, found where its position ids restart at 0."""
    bounds = segment_bounds(position_ids_T)
    return tuple((start, end, start, start) for start, end in itertools.pairwise(bounds))


def _segments_tensor(segments: tuple[Segment, ...], length: int) -> torch.Tensor:
    """`rlcoach_segments` for attention.py: the boundaries [S+1] of a row without a shared
    prefix, else its pieces [S, 4] (S >= 3: a prefix and two suffixes). A [1, 4] table of
    a one-sequence row would make a compiled layer specialise on the size 1 and compile
    again."""
    if all(context_start == context_end for _, _, context_start, context_end in segments):
        return torch.tensor([start for start, _, _, _ in segments] + [length], dtype=torch.long)
    return torch.tensor(segments, dtype=torch.long)


def _dense_mask(segments: tuple[Segment, ...], length: int, device: torch.device) -> torch.Tensor:
    """The [1, 1, T, T] boolean mask of a row's pieces, for attention implementations
    other than `SEGMENT_ATTENTION` (and as the plain reference the tests compare with)."""
    allowed_TT = torch.zeros(length, length, dtype=torch.bool, device=device)
    for start, end, context_start, context_end in segments:
        size = end - start
        allowed_TT[start:end, start:end] = torch.ones(size, size, dtype=torch.bool).tril()
        allowed_TT[start:end, context_start:context_end] = True
    return allowed_TT[None, None]


def _predictors(segments: tuple[Segment, ...], length: int) -> torch.Tensor | None:
    """Which hidden state predicts each of the row's tokens 1..T-1: the one before it,
    except a suffix's first token, predicted by its prefix's last one (None: no suffix)."""
    moved = [
        (start - 1, context_end - 1)  # hidden state start - 1 predicts token start
        for start, _, context_start, context_end in segments
        if context_end > context_start and start != context_end
    ]
    if not moved:
        return None
    index_T = torch.arange(length - 1)
    for at, source in moved:
        index_T[at] = source
    return index_T


def chunked_token_logprobs(
    causal_lm: Any,
    input_ids_1T: torch.Tensor,
    position_ids_1T: torch.Tensor,
    chunk: int,
    compiled: bool = False,
    fused_logprob: bool = False,
    segments: tuple[Segment, ...] = (),
) -> torch.Tensor:
    """Log-prob of each token given the ones before it, shape [T-1] (fp32).

    `segments` are the row's attention pieces (`PackedRow.segments`: shared prefixes and
    their suffixes); empty: one piece per sequence, where the position ids restart at 0.
    `compiled` runs the vocabulary projection through `torch.compile`; `fused_logprob`
    uses the compiled `TargetLogprob` of fusion.py instead where the output layer is a
    frozen bias-free linear (the trainer sets them on a GPU only)."""
    backbone = causal_lm.get_decoder() if hasattr(causal_lm, "get_decoder") else causal_lm.model
    lm_head = causal_lm.get_output_embeddings()
    length = input_ids_1T.shape[1]
    segments = segments or _plain_segments(position_ids_1T[0])
    if getattr(causal_lm.config, "_attn_implementation", None) == SEGMENT_ATTENTION:
        # Per-sequence attention: boundaries instead of a mask (see attention.py).
        hidden_1TH = backbone(
            input_ids=input_ids_1T,
            position_ids=position_ids_1T,
            rlcoach_segments=_segments_tensor(segments, length),
        ).last_hidden_state
    else:
        # Any other attention: a dense mask of the same pieces (sdpa ignores position ids).
        hidden_1TH = backbone(
            input_ids=input_ids_1T,
            position_ids=position_ids_1T,
            attention_mask=_dense_mask(segments, length, input_ids_1T.device),
        ).last_hidden_state
    predictors_T = _predictors(segments, length)
    if predictors_T is None:
        hidden_TH = hidden_1TH[0, :-1]
    else:  # a shared prefix's last state predicts each of its suffixes' first token
        hidden_TH = hidden_1TH[0].index_select(0, upload(predictors_T, hidden_1TH.device))
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
    ).to(device)  # type: ignore[arg-type]  # transformers' stubs take a model here
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
                module.cast_input_dtype_enabled = False  # type: ignore[assignment]  # peft's flag
        # GPU only (fusion.py): on the CPU inductor's compiling costs more than it saves.
        if config.fused_lora:
            fuse_lora_linears(model)
        if config.compile_layers:
            compile_decoder_layers(base)
    return model


def serving_dtype(model: Any) -> torch.dtype:
    """The dtype an engine serves the adapter in: the base weights' (bf16 on a GPU, the
    CPU's fp32); the engine casts an adapter to it anyway, so a copy in it loses nothing."""
    frozen = (p.dtype for p in model.parameters() if not p.requires_grad)
    return next(frozen, torch.float32)


def save_serving_adapter(model: Any, folder: Path) -> None:
    """The adapter as an engine loads it — peft's `adapter_config.json` and
    `adapter_model.safetensors`, peft's keys — in the engine's dtype (`serving_dtype`),
    written for the publish's sake: the weights cross to the host in one copy (peft's
    writer copies each of a 36-layer model's ~500 tensors on its own, each copy waiting
    for the GPU) and no model card is written."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    name = model.active_adapter
    named = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    state = get_peft_model_state_dict(model, state_dict=named, adapter_name=name)
    dtype = serving_dtype(model)
    host = torch.cat([t.reshape(-1).to(dtype) for t in state.values()]).cpu()
    pieces = host.split([t.numel() for t in state.values()])
    # each its own storage: safetensors refuses tensors that share one
    tensors = {k: p.view(t.shape).clone() for (k, t), p in zip(state.items(), pieces, strict=True)}
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = copy.deepcopy(model.peft_config[name])
    config.inference_mode = True  # as peft writes it
    config.save_pretrained(str(folder))


def build_optimizer(model: Any, config: TrainConfig, fused: bool) -> torch.optim.AdamW:
    """AdamW over the model's trainable (LoRA) parameters, in `named_parameters` order."""
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
        fused=fused,
    )


class LoraTrainer:
    """A causal LM with a peft LoRA adapter and its optimizer, in this process (the
    `Trainer` of base.py)."""

    def __init__(
        self, model_path: str | Path, config: TrainConfig, device: str | None = None
    ) -> None:
        self.config = config
        default = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device or default)
        self.model = build_lora_model(model_path, config, self.device)
        self.optimizer = build_optimizer(self.model, config, fused=self.device.type == "cuda")
        self.closed = False

    def row_logprobs(self, row: PackedRow, use_adapter: bool = True) -> torch.Tensor:
        ids, positions = (
            upload(row.input_ids_T[None], self.device),
            upload(row.position_ids_T[None], self.device),
        )
        causal_lm = self.model.get_base_model()
        gpu = self.device.type == "cuda"
        options: dict[str, Any] = {
            "chunk": self.config.logprob_chunk_tokens,
            "compiled": self.config.compile_layers and gpu,
            "fused_logprob": self.config.fused_logprob and gpu,
            "segments": row.segments,
        }
        # bf16 autocast where bf16 is fast, plain fp32 elsewhere: see hardware.py.
        with autocast(self.device):
            if use_adapter:
                return chunked_token_logprobs(causal_lm, ids, positions, **options)
            with self.model.disable_adapter(), torch.no_grad():
                return chunked_token_logprobs(causal_lm, ids, positions, **options)

    # -- the step's hooks (step.py): one process runs every row, and sums are its own

    def rows(self, part: list[TrainSequence], config: TrainConfig) -> list[PackedRow]:
        if config.share_prefix:
            return pack_shared(
                share_prefixes(part, config.micro_batch_tokens), config.micro_batch_tokens
            )
        return pack_sequences(part, config.micro_batch_tokens)

    def sum_over_ranks(self, values: list[float]) -> list[float]:
        return values

    def max_over_ranks(self, values: list[float]) -> list[float]:
        return values

    def step(self, groups: list[TrajectoryGroup], config: TrainConfig | None = None) -> StepStats:
        """Train on `groups`; returns stats (`trained=False` when no group had variance)."""
        return grpo_step(self, groups, config or self.config)

    def save(self, folder: Path) -> None:
        """Write the peft adapter (loadable by vLLM and transformers) and optimizer state."""
        self.save_adapter(folder)
        self.save_optimizer(folder)

    def save_adapter(self, folder: Path, serving: bool = False) -> None:
        """Write only the adapter: all an engine needs to serve the new weights
        (`serving`: cast to the base weights' dtype, as the engine serves them)."""
        if not serving:
            self.model.save_pretrained(folder)
            return
        save_serving_adapter(self.model, Path(folder))

    def save_optimizer(self, folder: Path) -> None:
        """Write AdamW's state (twice the adapter's size) atomically into `folder`."""
        save_optimizer_state(self.optimizer, Path(folder), write=True)

    def load(self, folder: Path) -> None:
        """Resume adapter weights and optimizer state from a checkpoint folder
        (`CheckpointError` for one that is missing or does not fit)."""
        load_checkpoint(Path(folder), self.model, self.optimizer)

    def close(self) -> None:
        """Nothing runs beside this process; the model goes with the last reference."""
        self.closed = True
