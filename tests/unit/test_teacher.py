"""On-policy distillation's per-token advantages, their signs, and the tokenizer check.

The sign tests run the real LoRA trainer on the tiny random-weight Llama (tests/tiny_llama.py):
the teacher's log-probs are the student's own shifted by known amounts, so which tokens the
teacher prefers is known exactly. The tokenizer check compares the bundled model's real
tokenizer with a real, different BPE tokenizer trained here by `tokenizers`.
"""

import math
import sys
from pathlib import Path

import pytest
import torch

from rlcoach import ConfigError, SampledChoice, Teacher, TrainableModel, Trajectory
from rlcoach.config import TrainConfig
from rlcoach.rollout.teacher import _sequences, tokenizer_mismatch
from rlcoach.trainer.objective import teacher_advantages
from rlcoach.trainer.sequences import build_sequences, pack_sequences
from rlcoach.trainer.step import collect_sequences

sys.path.insert(0, str(Path(__file__).parents[1]))
from tiny_llama import tiny_groups


def test_a_token_the_teacher_likes_more_gets_a_positive_advantage():
    teacher_T = torch.tensor([-0.1, -3.0, -1.0, math.nan, -2.0])
    student_T = torch.tensor([-2.0, -0.5, -1.0, -1.0, math.nan])
    advantages_T = teacher_advantages(teacher_T, student_T, coef=0.5)
    assert advantages_T.tolist() == pytest.approx([0.95, -1.25, 0.0, 0.0, 0.0])


def _choice(prompt, sampled, logprobs, teacher=None):
    return SampledChoice(
        message={"role": "assistant"},
        prompt_token_ids=prompt,
        token_ids=sampled,
        logprobs=logprobs,
        teacher_logprobs=teacher,
        policy="p@0",
    )


def test_per_token_advantages_cover_every_turn_and_only_the_sampled_tokens():
    first = _choice([1, 2, 3], [4, 5], [-1.0, -2.0], [-0.5, -3.0])
    # The second turn's prompt extends the first (a tool result 6, 7): one sequence.
    second = _choice([1, 2, 3, 4, 5, 6, 7], [8], [-1.0], [-0.25])
    trajectory = Trajectory(choices=[first, second], reward=1.0)
    (sequence,) = build_sequences(trajectory, advantage=0.2, teacher_coef=2.0)
    assert sequence.token_ids == [1, 2, 3, 4, 5, 6, 7, 8]
    expected = [0.0, 0.0, 0.0, 0.2 + 1.0, 0.2 - 2.0, 0.0, 0.0, 0.2 + 1.5]
    assert sequence.token_advantages == pytest.approx(expected)
    (row,) = pack_sequences([sequence], 64)
    assert row.advantages_T.tolist() == pytest.approx(expected)
    # The teacher's walk asks for the same sequence once, each choice at its offset.
    ((ids, placed),) = _sequences(trajectory.choices)
    assert ids == sequence.token_ids and [start for _, start in placed] == [3, 7]


def test_choices_with_a_wrong_number_of_teacher_log_probs_are_refused():
    with pytest.raises(Exception, match="2 token ids but 1 teacher log-probs"):
        _choice([1], [2, 3], [-1.0, -1.0], [-1.0])


def _as_own(trainer, groups, shift_of):
    """Set each choice's sampler log-probs to the trainer's own and its teacher's to those
    plus `shift_of(token index)`; return the (choice, shifts) pairs."""
    shifted = []
    for group in groups:
        for trajectory in group.trajectories:
            choice = trajectory.choices[0]
            [sequence] = build_sequences(trajectory, 1.0)
            [row] = pack_sequences([sequence], len(sequence.token_ids))
            with torch.no_grad():
                own = trainer.row_logprobs(row)[-len(choice.token_ids) :].tolist()
            shifts = [shift_of(i) for i in range(len(own))]
            choice.logprobs = own
            choice.teacher_logprobs = [o + s for o, s in zip(own, shifts, strict=True)]
            shifted.append((trajectory, shifts))
    return shifted


def _own_logprobs(trainer, trajectory):
    [sequence] = build_sequences(trajectory, 1.0)
    [row] = pack_sequences([sequence], len(sequence.token_ids))
    with torch.no_grad():
        return trainer.row_logprobs(row)[-len(trajectory.choices[0].token_ids) :]


def test_a_teacher_equal_to_the_student_gives_zero_advantages_and_changes_nothing(tiny_model):
    from rlcoach.trainer.lora import LoraTrainer

    config = TrainConfig(learning_rate=1e-2, micro_batch_tokens=64, reward_coef=0.0)
    trainer = LoraTrainer(tiny_model, config, device="cpu")
    groups = tiny_groups(1)
    _as_own(trainer, groups, lambda i: 0.0)
    sequences, skipped, _ = collect_sequences(groups, config)
    assert sequences == [] and skipped == len(groups)
    before = [p.detach().clone() for p in trainer.model.parameters() if p.requires_grad]
    stats = trainer.step(groups)
    assert not stats.trained and stats.groups_skipped_no_variance == len(groups)
    after = [p for p in trainer.model.parameters() if p.requires_grad]
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))


def test_a_distillation_step_moves_the_student_towards_the_teacher(tiny_model):
    """Pure distillation (`reward_coef=0`): the teacher likes even-indexed tokens more than
    the student (+1 nat) and odd ones less (-1 nat); one step raises the student's
    log-probs of the first and lowers those of the second."""
    from rlcoach.trainer.lora import LoraTrainer

    config = TrainConfig(learning_rate=2e-2, micro_batch_tokens=64, reward_coef=0.0, seed=2)
    trainer = LoraTrainer(tiny_model, config, device="cpu")
    groups = tiny_groups(2)
    shifted = _as_own(trainer, groups, lambda i: 1.0 if i % 2 == 0 else -1.0)
    stats = trainer.step(groups)
    assert stats.trained and stats.groups_skipped_no_variance == 0
    liked = disliked = 0.0
    for trajectory, shifts in shifted:
        moved = _own_logprobs(trainer, trajectory) - torch.tensor(trajectory.choices[0].logprobs)
        for delta, shift in zip(moved.tolist(), shifts, strict=True):
            if shift > 0:
                liked += delta
            else:
                disliked += delta
    assert liked > 0 > disliked


def test_a_teacher_with_another_tokenizer_is_refused_with_the_reason(model_path, other_tokenizer):
    assert tokenizer_mismatch(model_path, model_path) is None
    problem = tokenizer_mismatch(model_path, other_tokenizer)
    assert problem is not None and "49152 tokens" in problem
    student = TrainableModel("student", "unit")
    teacher = Teacher(student.name + "@0", tokenizer=other_tokenizer)
    with pytest.raises(ConfigError) as caught:
        teacher.check(student)
    message = str(caught.value)
    assert "does not share" in message and "differ" in message and "fix:" in message.lower()
    # The same tokenizer passes (and is remembered).
    Teacher("student@0", tokenizer=model_path).check(student)


def test_a_teacher_on_another_server_must_name_its_tokenizer():
    from rlcoach import Model

    with pytest.raises(ConfigError, match="tokenizer="):
        Teacher(Model("big", base_url="http://127.0.0.1:9/v1"))
