"""Checks on training input before anything is trained or written: one layer, two callers.

`rlcoach serve` runs `check_groups` / `check_examples` on every upload before it is
acknowledged (a failure answers HTTP 400 `invalid_training_data`, which a client never
retries), and `LocalBackend.train` / `train_sft` run the same checks in process, so a
trajectory built by hand gets the same answer as one sent over HTTP.

What is checked, and why:
- every token id (prompt and sampled) lies in the model's vocabulary: an id past the
  embedding table fails the step deep inside torch (`IndexError` on a CPU, a device-side
  assert that poisons the process on a GPU);
- every sampled call fits the engine's context (`max_model_len`): the engine could not
  have produced a longer one, and the trainer would build rows it cannot afford;
- rewards and log-probs are finite numbers: one NaN makes every advantage, the loss and
  then the adapter NaN. (JSON cannot carry NaN, but Python's `json` and pydantic accept
  the literal `NaN`, and `LocalBackend` gets Python floats.)
The first problem found is reported, naming the trajectory, the place, the value and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlcoach.errors import TrainingDataError
from rlcoach.trajectory.trajectories import ChatRecord, Trajectory, TrajectoryGroup

__all__ = ["TrainingLimits", "check_examples", "check_groups", "training_limits"]


@dataclass(frozen=True, slots=True)
class TrainingLimits:
    """What training input must fit: the model's vocabulary and the engine's context."""

    vocab_size: int
    max_model_len: int


def training_limits(model_path: str | Path, max_model_len: int) -> TrainingLimits:
    """The limits of the model folder `model_path` served with `max_model_len`."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return TrainingLimits(int(text.vocab_size), max_model_len)


def _refuse(trajectory: Trajectory, where: str, problem: str, fix: str) -> TrainingDataError:
    return TrainingDataError(f"trajectory {trajectory.id[:80]!r} ({where}) {problem}; fix: {fix}")


def check_trajectory(trajectory: Trajectory, limits: TrainingLimits, where: str) -> None:
    """Raise `TrainingDataError` for the first problem of one trajectory."""
    if not math.isfinite(trajectory.reward):
        raise _refuse(
            trajectory,
            where,
            f"has reward {trajectory.reward!r}, not a finite number",
            "give every trajectory a finite reward (a failed rollout is recorded as a "
            "failure on its group, not as a NaN reward)",
        )
    for h, history in enumerate(trajectory.histories()):
        for c, choice in enumerate(history.choices):
            place = f"{where}, history {h}, choice {c}"
            for part, ids in (("prompt", choice.prompt_token_ids), ("sampled", choice.token_ids)):
                if ids and (min(ids) < 0 or max(ids) >= limits.vocab_size):
                    bad = next(i for i in ids if not 0 <= i < limits.vocab_size)
                    raise _refuse(
                        trajectory,
                        place,
                        f"has {part} token id {bad} at position {ids.index(bad)}, outside "
                        f"the model's vocabulary of {limits.vocab_size} ids",
                        "train on the token ids this server's engine sampled (record "
                        "rollouts through model.openai_client() of this base model)",
                    )
            length = len(choice.prompt_token_ids) + len(choice.token_ids)
            if length > limits.max_model_len:
                raise _refuse(
                    trajectory,
                    place,
                    f"has {length} tokens (prompt and sampled), over the engine's "
                    f"max_model_len of {limits.max_model_len}",
                    "send calls the engine produced, or serve with a larger --max-model-len",
                )
            # NaN marks a token without a sampler log-prob: in a rendered client reply
            # (trainer/render.py) or a constrained choice left to the trainer; nowhere else.
            rendered = choice.logprobs_may_be_unknown
            if not all(math.isfinite(x) or (rendered and math.isnan(x)) for x in choice.logprobs):
                bad_index = next(
                    i
                    for i, x in enumerate(choice.logprobs)
                    if not (math.isfinite(x) or (rendered and math.isnan(x)))
                )
                raise _refuse(
                    trajectory,
                    place,
                    f"has log-prob {choice.logprobs[bad_index]!r} at position {bad_index}, "
                    "not a finite number",
                    "send the log-probs the engine returned with the tokens",
                )


def check_groups(groups: Sequence[TrajectoryGroup], limits: TrainingLimits) -> None:
    """Raise `TrainingDataError` for the first problem in a batch of groups."""
    for g, group in enumerate(groups):
        for t, trajectory in enumerate(group.trajectories):
            check_trajectory(trajectory, limits, f"groups[{g}].trajectories[{t}]")


def check_examples(examples: Sequence[Trajectory | ChatRecord], limits: TrainingLimits) -> None:
    """The same for SFT examples (chat records carry no ids: they are rendered later)."""
    for index, example in enumerate(examples):
        if isinstance(example, Trajectory):
            check_trajectory(example, limits, f"examples[{index}]")
