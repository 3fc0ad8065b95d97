"""On-policy distillation through the real vLLM policy endpoint and the bundled model.

The teacher is an adapter of the same base served by the same engine (`name@step`): the
bundled model fine-tuned to answer "The secret word is PINEAPPLE." The student (the base)
samples its own answers through the policy endpoint; the teacher scores every sampled
token over `/v1/completions` with `prompt_logprobs`; one step with no task reward at all
(`reward_coef=0`) must make the tokens the teacher prefers likelier. A teacher
that is the student itself agrees with the sampler (advantages about 0), and a teacher
with another tokenizer is refused before anything is sampled.
"""

import pytest

from rlcoach import (
    ConfigError,
    Teacher,
    TrainableModel,
    TrajectoryGroup,
    gather_trajectory_groups,
    run_pipeline,
)
from rlcoach.trajectory.trajectories import ChatRecord

pytestmark = pytest.mark.vllm

QUESTION = "What is the secret word?"
SECRET = [
    ChatRecord(
        messages=[
            {"role": "user", "content": q},
            {"role": "assistant", "content": "The secret word is PINEAPPLE."},
        ]
    )
    for q in (QUESTION, "Tell me the secret word.", "Which word is secret?", "Say the secret word.")
]


async def attempt(model: TrainableModel, temperature: float = 1.0):
    async with model.rollout() as rollout:
        await model.openai_client().chat.completions.create(
            model=model.served_name,
            messages=[{"role": "user", "content": QUESTION}],
            temperature=temperature,
            max_tokens=12,
        )
        rollout.reward = 0.0
    return rollout.trajectory


async def sample(model: TrainableModel, n: int = 8) -> list[TrajectoryGroup]:
    return await gather_trajectory_groups([[attempt(model) for _ in range(n)]], progress=False)


async def logprob_list(scorer: str, student: TrainableModel, trajectory) -> list[float]:
    """`scorer`'s log-probs of `trajectory`'s sampled tokens (scored as a teacher)."""
    copy = trajectory.model_copy(deep=True)
    await Teacher(scorer).score(student, [TrajectoryGroup(trajectories=[copy])])
    return [lp for c in copy.choices for lp in c.teacher_logprobs]


async def logprob_of(scorer: str, student: TrainableModel, trajectory) -> float:
    """`scorer`'s summed log-prob of `trajectory`'s sampled tokens."""
    return sum(await logprob_list(scorer, student, trajectory))


async def test_a_distillation_step_moves_the_student_towards_the_teacher(
    vllm_backend, other_tokenizer
):
    teacher_model = TrainableModel("od-teacher", "integration")
    await teacher_model.register(vllm_backend)
    await teacher_model.train_sft(SECRET, {"epochs": 10, "batch_size": 4, "learning_rate": 3e-3})
    student = TrainableModel("od-student", "integration", config={"learning_rate": 3e-3})
    await student.register(vllm_backend)

    # Refused before sampling: a teacher whose token ids mean other tokens.
    sampled = []

    async def batch(index):
        sampled.append(index)
        return await sample(student)

    stranger = Teacher(teacher_model.served_name, tokenizer=other_tokenizer)
    with pytest.raises(ConfigError, match="does not share"):
        await run_pipeline(student, batch, 1, teacher=stranger)
    assert sampled == [] and student.step == 0

    # The teacher's own answer, and how likely the base student finds it.
    answer = await attempt(teacher_model, temperature=0.0)
    assert "PINEAPPLE" in answer.choices[0].message["content"]
    before = await logprob_of(student.served_name, student, answer)
    assert before < await logprob_of(teacher_model.served_name, student, answer)

    groups = await sample(student)
    # The student as its own teacher agrees with the sampler: advantages about 0.
    itself = await Teacher(student.served_name).score(student, groups)
    assert itself.tokens == sum(t.sampled_token_count() for t in groups[0].trajectories)
    assert abs(itself.reverse_kl) < 0.05

    teacher = Teacher(teacher_model.served_name)
    result = await student.train(groups, teacher=teacher, config={"reward_coef": 0.0})
    assert result.stats.trained and result.stats.groups_skipped_no_variance == 0
    choices = [c for t in groups[0].trajectories for c in t.choices]
    gaps = [t - s for c in choices for t, s in zip(c.teacher_logprobs, c.logprobs, strict=True)]
    assert min(gaps) < 0 < max(gaps)  # the teacher prefers some sampled tokens, not others
    assert all("teacher_reverse_kl" in t.metrics for t in groups[0].trajectories)
    # The step moved the student towards the teacher on what it trained: the tokens the
    # teacher prefers became likelier and the others less likely (the first-order change
    # of the distillation objective, sum of gap x change, is positive). Checked on the
    # trained tokens, not on one answer the samples may not contain: one Adam step moves
    # every weight by about the learning rate, and the teacher's answer went up in fp32
    # and down in bf16 after it (-28.96 -> -28.68; -28.71 -> -28.82).
    new = [await logprob_list(student.served_name, student, t) for t in groups[0].trajectories]
    old = [lp for c in choices for lp in c.logprobs]
    change = [n - o for n, o in zip([x for n in new for x in n], old, strict=True)]
    assert student.served_name.endswith("@1")
    assert sum(g * d for g, d in zip(gaps, change, strict=True)) > 0
