"""Training sequences from trajectories, on the exact token ids the engine sampled.

A history's choices are walked in call order. A call whose prompt ids start with the
sequence built so far (earlier prompt + sampled reply) extends it: the new prompt tokens
(tool results, the next turn header) are context, the reply is trained. A call whose
prompt does not extend it — the chat template re-rendered an earlier turn differently,
or it is another conversation — starts a new sequence, so every sampled token is trained
exactly once and nothing is ever re-tokenized. Sequences are then packed into rows of at
most `max_tokens` (first-fit decreasing); position ids restart at each sequence, and the
trainer gives each row a block-diagonal causal mask, so a sequence attends only to itself
(a test checks that packed log-probs equal unpacked ones).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlcoach.errors import TrainingDataError
from rlcoach.types import SampledChoice, Trajectory

__all__ = ["PackedRow", "TrainSequence", "build_sequences", "pack_sequences"]


@dataclass(frozen=True, slots=True)
class TrainSequence:
    """One token sequence: context plus sampled tokens, with their behaviour logprobs."""

    token_ids: list[int]
    sampled_mask: list[int]
    """1 where the policy sampled the token (trained), 0 for prompt and tool tokens."""
    old_logprobs: list[float]
    """The engine's logprob of each sampled token (0.0 on context)."""
    advantage: float
    trajectory_id: str

    @property
    def sampled_tokens(self) -> int:
        return sum(self.sampled_mask)


def _walk(choices: list[SampledChoice]) -> list[tuple[list[int], list[int], list[float]]]:
    built: list[tuple[list[int], list[int], list[float]]] = []
    ids: list[int] = []
    mask: list[int] = []
    old: list[float] = []
    for choice in choices:
        prompt = choice.prompt_token_ids
        if ids and prompt[: len(ids)] == ids:
            context = prompt[len(ids) :]
        else:
            if ids:
                built.append((ids, mask, old))
            ids, mask, old = [], [], []
            context = prompt
        ids = ids + list(context) + list(choice.token_ids)
        mask = mask + [0] * len(context) + [1] * len(choice.token_ids)
        old = old + [0.0] * len(context) + list(choice.logprobs)
    if ids:
        built.append((ids, mask, old))
    return built


def build_sequences(trajectory: Trajectory, advantage: float) -> list[TrainSequence]:
    """All training sequences of one trajectory (main and additional histories)."""
    sequences = []
    for history in trajectory.histories():
        for ids, mask, old in _walk(history.choices):
            if sum(mask) == 0:
                continue
            sequences.append(TrainSequence(ids, mask, old, advantage, trajectory.id))
    if not sequences:
        raise TrainingDataError(
            f"trajectory {trajectory.id!r} has no sampled choice (no token the policy "
            "sampled), so there is nothing to train on; fix: make the rollout's calls "
            "through `model.openai_client()` inside `model.rollout()`, or build choices "
            "with `SampledChoice.from_openai(...)`"
        )
    return sequences


@dataclass(frozen=True, slots=True)
class PackedRow:
    """Sequences concatenated into one row (batch size 1) for a forward pass."""

    input_ids_T: torch.Tensor
    position_ids_T: torch.Tensor
    sampled_mask_T: torch.Tensor
    old_logprobs_T: torch.Tensor
    advantages_T: torch.Tensor
    sequence_lengths: tuple[int, ...]


def pack_sequences(sequences: list[TrainSequence], max_tokens: int) -> list[PackedRow]:
    """First-fit decreasing packing; a sequence longer than `max_tokens` gets its own row."""
    bins: list[list[TrainSequence]] = []
    room: list[int] = []
    for sequence in sorted(sequences, key=lambda s: len(s.token_ids), reverse=True):
        size = len(sequence.token_ids)
        for index, free in enumerate(room):
            if size <= free:
                bins[index].append(sequence)
                room[index] -= size
                break
        else:
            bins.append([sequence])
            room.append(max_tokens - size)
    rows = []
    for members in bins:
        ids, positions, mask, old, advantages = [], [], [], [], []
        for s in members:
            ids += s.token_ids
            positions += range(len(s.token_ids))
            mask += s.sampled_mask
            old += s.old_logprobs
            advantages += [s.advantage] * len(s.token_ids)
        rows.append(
            PackedRow(
                input_ids_T=torch.tensor(ids, dtype=torch.long),
                position_ids_T=torch.tensor(positions, dtype=torch.long),
                sampled_mask_T=torch.tensor(mask, dtype=torch.float32),
                old_logprobs_T=torch.tensor(old, dtype=torch.float32),
                advantages_T=torch.tensor(advantages, dtype=torch.float32),
                sequence_lengths=tuple(len(s.token_ids) for s in members),
            )
        )
    return rows
