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

Prefix sharing (`share_prefixes`, `pack_shared`): the samples of a GRPO group start with
the same prompt, so packed one by one their prompt's forward and backward run once per
sample. Sequences whose context starts with the same tokens are instead packed as the
prefix once, then each sequence's suffix: the suffix attends to the prefix and causally to
itself, its position ids continue from the prefix length, and its first token is
predicted by the prefix's last hidden state. The prefix holds context tokens only, so the
loss and its normaliser are unchanged; the gradient through the prefix's hidden states
is the sum over its suffixes, as it would be over the repeated copies. Log-probs and
gradients equal the unshared ones up to rounding (tests/unit/test_prefix_sharing.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from rlcoach.config import row_token_limit
from rlcoach.errors import TrainingDataError
from rlcoach.trainer.objective import teacher_advantages
from rlcoach.trajectory.trajectories import SampledChoice, Trajectory

__all__ = [
    "MIN_SHARED_TOKENS",
    "PackedRow",
    "Segment",
    "SharedPrefix",
    "TrainSequence",
    "build_sequences",
    "check_logprobs",
    "pack_sequences",
    "pack_shared",
    "share_prefixes",
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
    token_advantages: list[float] = field(default_factory=list)
    """Each token's own advantage (on-policy distillation: the group's `advantage` plus
    the teacher's per-token term, objective.py `teacher_advantages`); empty when every
    token gets `advantage`."""

    @property
    def sampled_tokens(self) -> int:
        return sum(self.sampled_mask)


Walked = tuple[list[int], list[int], list[float], list[int], list[float]]
"""ids, trained mask, old log-probs, forced mask and teacher log-probs (NaN where none)
of one sequence."""


def _walk(choices: list[SampledChoice], train_forced: bool) -> list[Walked]:
    built: list[Walked] = []
    ids: list[int] = []
    mask: list[int] = []
    old: list[float] = []
    forced: list[int] = []
    teacher: list[float] = []
    for choice in choices:
        prompt = choice.prompt_token_ids
        if ids and prompt[: len(ids)] == ids:
            context = prompt[len(ids) :]
        else:
            if ids:
                built.append((ids, mask, old, forced, teacher))
            ids, mask, old, forced, teacher = [], [], [], [], []
            context = prompt
        forced_here = [0] * len(choice.token_ids)
        for index in choice.forced:
            forced_here[index] = 1
        trained = [1 - f for f in forced_here] if not train_forced else [1] * len(forced_here)
        ids = ids + list(context) + list(choice.token_ids)
        mask = mask + [0] * len(context) + trained
        old = old + [0.0] * len(context) + list(choice.logprobs)
        forced = forced + [0] * len(context) + forced_here
        scored = choice.teacher_logprobs or [math.nan] * len(choice.token_ids)
        teacher = teacher + [math.nan] * len(context) + list(scored)
    if ids:
        built.append((ids, mask, old, forced, teacher))
    return built


def check_logprobs(trajectory: Trajectory) -> None:
    """Refuse a trajectory whose recorded log-probs the policy endpoint cannot have returned."""
    # Not `trajectory.histories()`: building those re-validates, with no trajectory id.
    histories = [trajectory.choices, *(h.choices for h in trajectory.additional_histories)]
    for number, choices in enumerate(histories):
        where = "the main history" if number == 0 else f"additional history {number - 1}"
        for index, choice in enumerate(choices):
            problem = None
            # NaN where no sampler log-prob was recorded (a rendered client reply, a
            # constrained choice left to the trainer); the loss uses the trainer's own there.
            known = (
                [lp for lp in choice.logprobs if not math.isnan(lp)]
                if choice.logprobs_may_be_unknown
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
    trajectory: Trajectory,
    advantage: float,
    *,
    train_forced: bool = False,
    teacher_coef: float = 1.0,
) -> list[TrainSequence]:
    """All training sequences of one trajectory (main and additional histories).

    `train_forced` puts forced tokens in the trained mask too (SFT imitates them). Where
    a teacher scored the sampled tokens, each trained token's advantage is `advantage`
    plus `teacher_coef * (teacher - sampler)` log-prob (`teacher_advantages`)."""
    check_logprobs(trajectory)
    sequences = []
    for history in trajectory.histories():
        for ids, mask, old, forced, teacher in _walk(history.choices, train_forced):
            if sum(mask) == 0:  # nothing sampled, or every token forced
                continue
            kept_forced = forced if any(forced) else []
            per_token = _token_advantages(advantage, mask, old, teacher, teacher_coef)
            sequences.append(
                TrainSequence(ids, mask, old, advantage, trajectory.id, kept_forced, per_token)
            )
    if not sequences and trajectory.sampled_token_count() == 0:
        raise TrainingDataError(
            f"trajectory {trajectory.id!r} has no sampled choice (no token the policy "
            "sampled), so there is nothing to train on; fix: make the rollout's calls "
            "through `model.openai_client()` inside `model.rollout()`, or build choices "
            "with `SampledChoice.from_openai(...)`"
        )
    return sequences


def _token_advantages(
    advantage: float, mask: list[int], old: list[float], teacher: list[float], coef: float
) -> list[float]:
    """Per-token advantages where a teacher scored a trained token; empty otherwise (every
    token then gets `advantage`)."""
    if not any(m and not math.isnan(t) for m, t in zip(mask, teacher, strict=True)):
        return []
    terms_T = teacher_advantages(
        torch.tensor(teacher, dtype=torch.float64), torch.tensor(old, dtype=torch.float64), coef
    )
    mask_T = torch.tensor(mask, dtype=torch.float64)
    return (mask_T * (advantage + terms_T)).tolist()


MIN_SHARED_TOKENS = 8
"""The shortest prefix worth sharing: below it the extra attention pieces cost about what
the tokens saved would."""


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """Sequences that start with the same `prefix_tokens` context tokens: packed as the
    prefix once, then each sequence's remaining tokens (its suffix). `prefix_tokens` is 0
    for a sequence that shares nothing (then `sequences` holds just it)."""

    prefix_tokens: int
    sequences: tuple[TrainSequence, ...]

    @property
    def tokens(self) -> int:
        """Tokens this unit puts into a row."""
        shared = self.prefix_tokens
        return shared + sum(len(s.token_ids) - shared for s in self.sequences)


def _context_length(sequence: TrainSequence) -> int:
    """Tokens before the first sampled one, but at least one token left after them: the
    most of the sequence a shared prefix may cover (it holds context only)."""
    first_sampled = sequence.sampled_mask.index(1) if 1 in sequence.sampled_mask else 0
    return min(first_sampled, len(sequence.token_ids) - 1)


def _common_length(a: list[int], b: list[int], limit: int) -> int:
    """Length of the longest common prefix of `a` and `b`, at most `limit` (binary
    search on slice equality: the comparisons run in C)."""
    low, high = 0, min(limit, len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def share_prefixes(
    sequences: list[TrainSequence], max_tokens: int, min_shared: int = MIN_SHARED_TOKENS
) -> list[SharedPrefix]:
    """Every sequence in exactly one unit; sequences whose context starts the same way
    share that prefix (token-exact, context tokens only).

    The sequences are sorted by their context tokens, so those that share the most are
    neighbours (a GRPO group's samples share their whole prompt; different questions
    behind one system prompt share less). A sweep then grows a unit while that does not
    reduce the tokens saved, `(members - 1) x prefix`: a new sequence that shares a
    shorter prefix joins only if the shorter prefix, counted once more, saves as much.
    A unit longer than `max_tokens` is cut into units that fit, each with the prefix
    (sequences longer than `max_tokens` themselves: into units of up to twice the longest,
    `_fit`)."""
    units: list[SharedPrefix] = []
    shared, members = 0, list[TrainSequence]()
    for sequence in sorted(sequences, key=lambda s: s.token_ids[: _context_length(s)]):
        if members:
            common = _common_length(
                members[0].token_ids, sequence.token_ids, min(shared, _context_length(sequence))
            )
            if common >= min_shared and len(members) * common >= (len(members) - 1) * shared:
                shared = common
                members.append(sequence)
                continue
            units += _fit(shared, members, max_tokens, min_shared)
        shared, members = _context_length(sequence), [sequence]
    return units + _fit(shared, members, max_tokens, min_shared)


def _fit(
    shared: int, members: list[TrainSequence], max_tokens: int, min_shared: int
) -> list[SharedPrefix]:
    """`members` (sharing `shared` tokens) as units of at most `max_tokens` tokens, or, when
    a member is longer than that (a long prompt: an agent's tools, a document), of at most
    twice the longest member: each would be a row over `max_tokens` on its own anyway, and
    held to it they would share nothing (measured on an MCP step's 21 sequences of ~1.8K
    tokens at 1,024 a row: 29.5K tokens computed alone, 10.9K shared in rows of up to
    3.8K, the CPU step 2.2x as fast for 1.3x the peak memory)."""
    if len(members) < 2 or shared < min_shared:
        return [SharedPrefix(0, (s,)) for s in members]
    limit = row_token_limit(max_tokens, max(len(s.token_ids) for s in members))
    units: list[SharedPrefix] = []
    chunk: list[TrainSequence] = []
    size = shared
    for sequence in sorted(members, key=lambda s: len(s.token_ids), reverse=True):
        suffix = len(sequence.token_ids) - shared
        if chunk and size + suffix > limit:
            units.append(_unit(shared, tuple(chunk)))
            chunk, size = [], shared
        chunk.append(sequence)
        size += suffix
    units.append(_unit(shared, tuple(chunk)))
    return units


Segment = tuple[int, int, int, int]
"""`(start, end, context_start, context_end)`: row positions `start:end` attend causally
to themselves and to all of `context_start:context_end` (their shared prefix; empty for a
sequence or prefix of its own)."""


@dataclass(frozen=True, slots=True)
class PackedRow:
    """Sequences concatenated into one row (batch size 1) for a forward pass.

    Token `i` of the row (i >= 1) is predicted by the hidden state at `i - 1`, except the
    first token of a suffix, which the last token of its prefix predicts (`segments`):
    the token log-probs of a row line up with `input_ids_T[1:]` either way."""

    input_ids_T: torch.Tensor
    position_ids_T: torch.Tensor
    sampled_mask_T: torch.Tensor
    old_logprobs_T: torch.Tensor
    advantages_T: torch.Tensor
    sequence_lengths: tuple[int, ...]
    """Lengths of the sequences whose tokens the row holds (before sharing)."""
    segments: tuple[Segment, ...] = ()
    """Attention pieces of the row (`Segment`); empty: one per sequence, found where the
    position ids restart at 0."""


def pack_shared(units: list[SharedPrefix], max_tokens: int) -> list[PackedRow]:
    """First-fit decreasing packing of units; a unit longer than `max_tokens` gets its
    own row. A shared prefix's positions run 0..P-1, each suffix's continue from P.

    A unit that fits no row whole is not given a new row at once: the row with the most
    room takes as many of its sequences as fit there with the prefix once more, while
    their suffixes hold at least as many tokens as the repeated prefix (`_take`). Whole
    GRPO groups of 8 x ~515 tokens filled rows of 8,240 tokens to 78% (two groups); split
    this way they fill them to ~98%, 13 rows a step instead of 16 (a pass costs about
    the same launches whatever it holds, and the memory a row needs is that of a full one)."""
    bins: list[list[SharedPrefix]] = []
    room: list[int] = []

    def put(index: int, unit: SharedPrefix) -> None:
        bins[index].append(unit)
        room[index] -= unit.tokens

    for unit in sorted(units, key=lambda u: u.tokens, reverse=True):
        while True:
            fits = next((i for i, free in enumerate(room) if unit.tokens <= free), None)
            if fits is not None:
                put(fits, unit)
                break
            part = _take(unit, max(room)) if room and unit.tokens <= max_tokens else None
            if part is None:
                bins.append([unit])
                room.append(max_tokens - unit.tokens)
                break
            put(room.index(max(room)), part[0])
            unit = part[1]
    return [_row(members) for members in bins]


def _take(unit: SharedPrefix, room: int) -> tuple[SharedPrefix, SharedPrefix] | None:
    """`unit` cut in two, the first part at most `room` tokens (its longest sequences that
    fit), when that part's suffixes outweigh its copy of the prefix; else None."""
    shared = unit.prefix_tokens
    if shared == 0 or len(unit.sequences) < 2:
        return None
    taken: list[TrainSequence] = []
    size = shared
    for sequence in sorted(unit.sequences, key=lambda s: len(s.token_ids), reverse=True):
        if size + len(sequence.token_ids) - shared <= room:
            taken.append(sequence)
            size += len(sequence.token_ids) - shared
    if size - shared < shared or len(taken) == len(unit.sequences):
        return None
    chosen = {id(s) for s in taken}
    rest = tuple(s for s in unit.sequences if id(s) not in chosen)
    return _unit(shared, tuple(taken)), _unit(shared, rest)


def _unit(shared: int, sequences: tuple[TrainSequence, ...]) -> SharedPrefix:
    """A unit of `sequences` sharing `shared` tokens (none for one sequence alone)."""
    return SharedPrefix(shared if len(sequences) > 1 else 0, sequences)


def pack_sequences(sequences: list[TrainSequence], max_tokens: int) -> list[PackedRow]:
    """First-fit decreasing packing, no sharing; a sequence longer than `max_tokens` gets
    its own row."""
    return pack_shared([SharedPrefix(0, (s,)) for s in sequences], max_tokens)


def _row(units: list[SharedPrefix]) -> PackedRow:
    ids: list[int] = []
    positions: list[int] = []
    mask: list[int] = []
    old: list[float] = []
    advantages: list[float] = []
    segments: list[Segment] = []

    def add(s: TrainSequence, start: int, context: tuple[int, int]) -> None:
        first = len(ids)
        ids.extend(s.token_ids[start:])
        positions.extend(range(start, len(s.token_ids)))
        mask.extend(s.sampled_mask[start:])
        old.extend(s.old_logprobs[start:])
        if s.token_advantages:
            advantages.extend(s.token_advantages[start:])
        else:
            advantages.extend([s.advantage] * (len(s.token_ids) - start))
        segments.append((first, len(ids), *context))

    for unit in units:
        shared = unit.prefix_tokens
        if shared == 0:
            (sequence,) = unit.sequences
            add(sequence, 0, (len(ids), len(ids)))
            continue
        first = len(ids)
        ids.extend(unit.sequences[0].token_ids[:shared])
        positions.extend(range(shared))
        mask.extend([0] * shared)  # context only: never in the loss or its normaliser
        old.extend([0.0] * shared)
        advantages.extend([0.0] * shared)
        segments.append((first, first + shared, first, first))
        for sequence in unit.sequences:
            add(sequence, shared, (first, first + shared))
    return PackedRow(
        input_ids_T=torch.tensor(ids, dtype=torch.long),
        position_ids_T=torch.tensor(positions, dtype=torch.long),
        sampled_mask_T=torch.tensor(mask, dtype=torch.float32),
        old_logprobs_T=torch.tensor(old, dtype=torch.float32),
        advantages_T=torch.tensor(advantages, dtype=torch.float32),
        sequence_lengths=tuple(len(s.token_ids) for u in units for s in u.sequences),
        segments=tuple(segments),
    )
