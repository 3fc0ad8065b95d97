"""Supervised fine-tuning of the LoRA, on the same sequences and masks as RL.

SFT trains the policy's adapter to imitate given conversations: warm-up before RL (RL
cannot start from a model that never succeeds), distillation from a stronger teacher, or
a user's own chat logs. It shares everything with the GRPO step but the objective:

- **Sequences.** A `Trajectory` recorded by the policy endpoint trains on the exact token
  ids the engine sampled (`build_sequences`, the RL path). Anything else — a JSONL chat
  record, a teacher's trajectory that carries only messages — is rendered with the
  model's own chat template (the one the engine serves with, so SFT and sampling see the
  same tokens), turn by turn: assistant turn `i` is trained on the tokens that
  `messages[:i + 1]` adds to the prompt `messages[:i]` ends with (generation prompt
  included, so the turn's end-of-message token is trained too). System, user and tool
  tokens are context only. A template that re-renders earlier turns differently (one
  that drops old reasoning blocks, say) starts a new sequence, as in RL.
- **Loss.** Token-level negative log-likelihood, summed over a mini-batch's assistant
  tokens and divided by their count (every token weighs the same, whatever sequence it is
  in); micro-batching changes memory, not the result.
- **Batches.** `batch_size` sequences per optimizer step, shuffled each epoch with
  `seed`; packed rows and chunked log-probs as in RL (`LoraTrainer.row_logprobs`).

The optimizer is the trainer's own AdamW, so SFT and RL steps on one model continue one
optimizer state, and the backend numbers SFT checkpoints in the same step sequence.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlcoach.config import SFTConfig
from rlcoach.errors import TrainingDataError
from rlcoach.models.chat_template import template_messages
from rlcoach.runtime.failpoints import poison
from rlcoach.trainer.base import SFTStats
from rlcoach.trainer.sequences import TrainSequence, build_sequences, pack_shared, share_prefixes
from rlcoach.trainer.step import finite_update
from rlcoach.trajectory.trajectories import ChatRecord, Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from rlcoach.trainer.lora import LoraTrainer

__all__ = ["SFTStats", "chat_sequences", "load_sft_file", "sft_loss", "sft_sequences", "sft_train"]

logger = logging.getLogger(__name__)


def _render(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    generation_prompt: bool,
) -> list[int]:
    ids = tokenizer.apply_chat_template(
        template_messages(messages),
        tools=tools or None,
        tokenize=True,
        add_generation_prompt=generation_prompt,
        return_dict=False,
    )
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return [int(i) for i in ids]


def chat_sequences(record: ChatRecord, tokenizer: Any, source: str = "") -> list[TrainSequence]:
    """A chat record as training sequences: assistant turns trained, the rest context."""
    messages = [dict(m) for m in record.messages]
    sequences: list[TrainSequence] = []
    ids: list[int] = []
    mask: list[int] = []
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        prompt = _render(tokenizer, messages[:index], record.tools, generation_prompt=True)
        full = _render(tokenizer, messages[: index + 1], record.tools, generation_prompt=False)
        if full[: len(prompt)] != prompt or len(full) == len(prompt):
            raise TrainingDataError(
                f"chat record {source or '?'}: assistant turn {index} does not render as an "
                "extension of its prompt with this chat template, so its tokens cannot be "
                "told apart from the prompt; fix: check the record's roles and the template"
            )
        if ids and prompt[: len(ids)] == ids:
            context = prompt[len(ids) :]
        else:
            if ids:
                sequences.append(TrainSequence(ids, mask, [0.0] * len(ids), 1.0, source))
            ids, mask, context = [], [], prompt
        reply = full[len(prompt) :]
        ids = ids + context + reply
        mask = mask + [0] * len(context) + [1] * len(reply)
    if ids:
        sequences.append(TrainSequence(ids, mask, [0.0] * len(ids), 1.0, source))
    if not sequences:
        raise TrainingDataError(
            f"chat record {source or '?'} has no assistant message, so there is nothing to "
            "imitate; fix: include the assistant turns the model should learn"
        )
    return sequences


def sft_sequences(data: Iterable[Trajectory | ChatRecord], tokenizer: Any) -> list[TrainSequence]:
    """Training sequences for SFT: exact sampled tokens where recorded, else the template."""
    sequences: list[TrainSequence] = []
    for position, item in enumerate(data):
        if isinstance(item, Trajectory) and item.choices:
            # Imitation learns the whole reply, constrained tokens included.
            sequences += build_sequences(item, 1.0, train_forced=True)
        elif isinstance(item, Trajectory):
            record = ChatRecord(messages=item.messages, tools=item.tools)
            sequences += chat_sequences(record, tokenizer, item.id)
        elif isinstance(item, ChatRecord):
            sequences += chat_sequences(item, tokenizer, f"#{position}")
        else:
            raise TrainingDataError(
                f"SFT item #{position} is a {type(item).__name__}; fix: pass Trajectory or "
                "ChatRecord objects (`ChatRecord(messages=[...], tools=[...])`)"
            )
    return sequences


def load_sft_file(path: str | Path) -> list[Trajectory | ChatRecord]:
    """SFT examples from a JSONL file: each line a chat record (`{"messages": [...],
    "tools": [...]}`), a trajectory, or a trajectory group (as `save_groups` writes)."""
    items: list[Trajectory | ChatRecord] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                if not isinstance(data, dict):
                    raise ValueError(f"a JSON {type(data).__name__}, not an object")
                if "trajectories" in data:
                    items += TrajectoryGroup.model_validate(data).trajectories
                elif "choices" in data or "id" in data:
                    items.append(Trajectory.model_validate(data))
                else:
                    items.append(ChatRecord.model_validate(data))
            except ValueError as e:
                raise TrainingDataError(
                    f"{path}:{number} is not an SFT example ({e}); fix: write one JSON object "
                    'per line, e.g. {"messages": [{"role": "user", ...}, {"role": "assistant", '
                    "...}]}, or a trajectory group saved by rlcoach"
                ) from e
    if not items:
        raise TrainingDataError(f"{path} holds no SFT example; fix: add chat records")
    return items


def sft_loss(logprobs_T: torch.Tensor, mask_T: torch.Tensor, normalizer: float) -> torch.Tensor:
    """Negative log-likelihood of the masked tokens, divided by `normalizer`."""
    return -(logprobs_T * mask_T).sum() / normalizer


def _batches(sequences: Sequence[TrainSequence], config: SFTConfig) -> list[list[TrainSequence]]:
    batches = []
    for epoch in range(config.epochs):
        order = list(range(len(sequences)))
        random.Random(config.seed * 1_000_003 + epoch).shuffle(order)
        for start in range(0, len(order), config.batch_size):
            batches.append([sequences[i] for i in order[start : start + config.batch_size]])
    return batches


def _untrained(
    examples: int, started: float, non_finite: int = 0, optimizer_steps: int = 0
) -> SFTStats:
    """The stats of an SFT run that trained nothing: no assistant token, or the loss or
    gradient norm of optimizer step `non_finite` was not finite (after `optimizer_steps`
    updates, which the backend rolls back)."""
    return SFTStats(
        trained=False,
        examples=examples,
        sequences=0,
        optimizer_steps=optimizer_steps,
        trained_tokens=0,
        total_tokens=0,
        loss_first=0.0,
        loss_last=0.0,
        loss=0.0,
        grad_norm=0.0,
        seconds=time.perf_counter() - started,
        non_finite=non_finite,
    )


def sft_train(
    trainer: LoraTrainer,
    sequences: Sequence[TrainSequence],
    config: SFTConfig,
    examples: int | None = None,
    progress: bool = False,
) -> SFTStats:
    """Run `config.epochs` over `sequences` with the trainer's model and optimizer."""
    started = time.perf_counter()
    trainable = [s for s in sequences if s.sampled_tokens > 0]
    if not trainable:
        return _untrained(examples or 0, started)
    batches = _batches(trainable, config)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(batches), desc="sft", unit="step")
    losses, norms = list[float](), list[float]()
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    trainer.model.train()
    try:
        for batch in batches:
            for group in trainer.optimizer.param_groups:
                group["lr"] = config.learning_rate
            normalizer = float(sum(s.sampled_tokens for s in batch))
            trainer.optimizer.zero_grad(set_to_none=True)
            batch_loss = 0.0
            # Examples framed alike (a system prompt, an agent's tools) share that prefix.
            rows = pack_shared(
                share_prefixes(batch, config.micro_batch_tokens), config.micro_batch_tokens
            )
            for row in rows:
                logprobs_T = trainer.row_logprobs(row)
                loss = sft_loss(
                    logprobs_T, row.sampled_mask_T[1:].to(logprobs_T.device), normalizer
                )
                loss.backward()
                batch_loss += float(loss.detach())
            batch_loss = poison("update.loss", batch_loss)  # a fault test's NaN (failpoints.py)
            norm = float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm))
            if not finite_update(trainer.optimizer, batch_loss, norm, len(losses) + 1):
                return _untrained(examples or 0, started, len(losses) + 1, len(losses))
            norms.append(norm)
            losses.append(batch_loss)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{batch_loss:.3f}")
    finally:
        trainer.model.eval()
        if bar is not None:
            bar.close()
    return SFTStats(
        trained=True,
        examples=examples if examples is not None else len({s.trajectory_id for s in trainable}),
        sequences=len(trainable),
        optimizer_steps=len(losses),
        trained_tokens=sum(s.sampled_tokens for s in trainable),
        total_tokens=sum(len(s.token_ids) for s in trainable),
        loss_first=losses[0],
        loss_last=losses[-1],
        loss=sum(losses) / len(losses),
        grad_norm=sum(norms) / len(norms),
        seconds=time.perf_counter() - started,
    )
