"""Training sequences from trajectories, on the exact token ids the engine sampled.

A history's choices are walked in call order. A call whose prompt ids start with the
sequence built so far (earlier prompt + sampled reply) extends it: the new prompt tokens
(tool results, the next turn header) are context, the reply is trained. A call whose
prompt does not extend it — the chat template re-rendered an earlier turn differently,
or it is another conversation — starts a new sequence, so every sampled token is trained
exactly once and nothing is ever re-tokenized. Tokens a sampling constraint forced (the
only token a JSON schema, regex or forced tool choice allowed) are sampled but not the
policy's choice: they stay in the sequence as context and out of the loss mask. Before
anything is built, every choice's log-probs are checked against what the policy
endpoint can return (one per token, finite, at most 0, above vLLM's -9999 floor; NaN
only in a reply rendered from a client-built trajectory, `policy == "client"`, where no
sampler log-prob was recorded): a trajectory that fails is refused with its id.
Sequences are then packed into rows of at most `max_tokens` (first-fit decreasing);
position ids restart at each sequence, and the trainer gives each row a block-diagonal
causal mask, so a sequence attends only to itself (a test checks that packed log-probs
equal unpacked ones).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from rlcoach.errors import TrainingDataError
from rlcoach.trainer.render import CLIENT_POLICY
from rlcoach.types import SampledChoice, Trajectory

__all__ = [
    "PackedRow",
    "TrainSequence",
    "build_sequences",
    "check_logprobs",
    "pack_sequences",
]

LOGPROB_FLOOR = -9999.0
"""vLLM reports a log-prob of -inf (a token the sampler could not pick) as -9999.0."""


@dataclass(frozen=True, slots=True)
class TrainSequence:
    """One token sequence: context plus sampled tokens, with their behaviour logprobs."""

    token_ids: list[int]
    sampled_mask: list[int]
    """1 where the token is trained: the policy sampled it and no constraint forced it;
    0 for prompt, tool and forced tokens."""
    old_logprobs: list[float]
    """The engine's logprob of each sampled token (0.0 on context)."""
    advantage: float
    trajectory_id: str
    forced_mask: list[int] = field(default_factory=list)
    """1 where a sampling constraint forced the token (sampled, not trained); empty when
    none was forced."""

    @property
    def sampled_tokens(self) -> int:
        return sum(self.sampled_mask)


Walked = tuple[list[int], list[int], list[float], list[int]]
"""ids, trained mask, old log-probs, forced mask of one sequence."""


def _walk(choices: list[SampledChoice], train_forced: bool) -> list[Walked]:
    built: list[Walked] = []
    ids: list[int] = []
    mask: list[int] = []
    old: list[float] = []
    forced: list[int] = []
    for choice in choices:
        prompt = choice.prompt_token_ids
        if ids and prompt[: len(ids)] == ids:
            context = prompt[len(ids) :]
        else:
            if ids:
                built.append((ids, mask, old, forced))
            ids, mask, old, forced = [], [], [], []
            context = prompt
        forced_here = [0] * len(choice.token_ids)
        for index in choice.forced:
            forced_here[index] = 1
        trained = [1 - f for f in forced_here] if not train_forced else [1] * len(forced_here)
        ids = ids + list(context) + list(choice.token_ids)
        mask = mask + [0] * len(context) + trained
        old = old + [0.0] * len(context) + list(choice.logprobs)
        forced = forced + [0] * len(context) + forced_here
    if ids:
        built.append((ids, mask, old, forced))
    return built


def check_logprobs(trajectory: Trajectory) -> None:
    """Refuse a trajectory whose recorded log-probs the policy endpoint cannot have returned."""
    # Not `trajectory.histories()`: building those re-validates, with no trajectory id.
    histories = [trajectory.choices, *(h.choices for h in trajectory.additional_histories)]
    for number, choices in enumerate(histories):
        where = "the main history" if number == 0 else f"additional history {number - 1}"
        for index, choice in enumerate(choices):
            problem = None
            # A reply rendered from a client-built trajectory (render.py) has NaN where no
            # sampler log-prob was recorded; the loss uses the trainer's own there.
            known = (
                [lp for lp in choice.logprobs if not math.isnan(lp)]
                if choice.policy == CLIENT_POLICY
                else choice.logprobs
            )
            if len(choice.logprobs) != len(choice.token_ids):
                problem = (
                    f"{len(choice.logprobs)} log-probs for {len(choice.token_ids)} sampled tokens"
                )
            elif not all(math.isfinite(lp) for lp in known):
                bad = next(lp for lp in known if not math.isfinite(lp))
                problem = f"a log-prob of {bad} (not a finite number)"
            elif any(lp > 1e-3 for lp in known):
                problem = f"a log-prob of {max(known)} (above 0: a probability over 1)"
            elif any(lp <= LOGPROB_FLOOR for lp in known):
                problem = (
                    f"a log-prob of {min(known)} (vLLM's -inf: a token the sampler "
                    "could not have picked)"
                )
            elif any(not 0 <= f < len(choice.token_ids) for f in choice.forced):
                count = len(choice.token_ids)
                problem = f"forced positions {choice.forced} outside its {count} tokens"
            if problem is not None:
                raise TrainingDataError(
                    f"trajectory {trajectory.id!r}: choice {index} of {where} has {problem}, "
                    "so these cannot be the log-probs the policy endpoint returned and the "
                    "importance ratio would be meaningless; fix: record the choice through "
                    "the policy endpoint (`model.openai_client()` inside `model.rollout()`, "
                    "or `SampledChoice.from_openai` on its response) and do not edit its "
                    "`token_ids` or `logprobs`, or drop this trajectory from the group"
                )


def build_sequences(
    trajectory: Trajectory, advantage: float, *, train_forced: bool = False
) -> list[TrainSequence]:
    """All training sequences of one trajectory (main and additional histories).

    `train_forced` puts forced tokens in the trained mask too (SFT imitates them)."""
    check_logprobs(trajectory)
    sequences = []
    for history in trajectory.histories():
        for ids, mask, old, forced in _walk(history.choices, train_forced):
            if sum(mask) == 0:  # nothing sampled, or every token forced
                continue
            kept_forced = forced if any(forced) else []
            sequences.append(TrainSequence(ids, mask, old, advantage, trajectory.id, kept_forced))
    if not sequences and trajectory.sampled_token_count() == 0:
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
