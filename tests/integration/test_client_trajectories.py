"""Trajectories the client built itself train on the real vLLM server.

Two kinds, as users of ART and of their own loops write them: plain messages (logs, a
teacher's replies) and `messages_and_choices` holding the OpenAI `Choice` objects the
client received (with their log-probs). The trainer renders them with the model's chat
template, takes the sampler's log-probs where they line up, computes its own elsewhere,
and says how many tokens took each path in the step's metrics. Recorded exchanges keep
the exact path (the other integration tests). Messages no template renders faithfully
are refused with the trajectory id, the message index and the fix.
"""

import json
import math

import pytest
from openai import AsyncOpenAI

from rlcoach import TrainableModel, TrainingDataError, Trajectory, TrajectoryGroup

QUESTION = [{"role": "user", "content": "What is 2 + 3? Answer with a number."}]


@pytest.fixture(scope="module")
async def client_model(vllm_backend):
    model = TrainableModel("client-built", "integration", config={"learning_rate": 1e-3})
    await model.register(vllm_backend)
    return model


def _records(backend, model) -> list[dict]:
    text = backend.paths(model).metrics.read_text()
    return [json.loads(line) for line in text.splitlines()]


async def test_plain_messages_train(vllm_backend, client_model):
    group = TrajectoryGroup(
        Trajectory(messages=[*QUESTION, {"role": "assistant", "content": answer}], reward=r)
        for answer, r in (("5", 1.0), ("It is 6.", 0.0), ("Five, I think.", 0.5))
    )
    result = await client_model.train([group])
    assert result.stats.trained and result.step == 1
    rendering = result.rendering
    assert rendering["client_trajectories"] == 3
    assert rendering["tokens_retokenized"] == result.stats.sampled_tokens > 0
    assert rendering["tokens_without_sampler_logprobs"] == rendering["tokens_retokenized"]
    assert _records(vllm_backend, client_model)[-1]["tokens_retokenized"] > 0
    # No token has a sampler log-prob: none is in the sampler/trainer mismatch.
    assert math.isfinite(result.stats.loss) and result.stats.mismatch_abs_max == 0.0


async def test_openai_choice_objects_train(vllm_backend, client_model):
    client = AsyncOpenAI(base_url=vllm_backend.url + "/v1", api_key="none")
    completion = await client.chat.completions.create(
        model=client_model.name,
        messages=QUESTION,
        n=3,
        max_tokens=12,
        temperature=1.0,
        logprobs=True,
    )
    await client.close()
    with_ids, without_ids, plain = completion.choices
    assert with_ids.model_extra.get("token_ids")  # rlcoach's endpoint returns them
    del without_ids.model_extra["token_ids"]  # as from a server that does not
    group = TrajectoryGroup(
        [
            Trajectory(messages_and_choices=[*QUESTION, with_ids], reward=1.0),
            Trajectory(messages_and_choices=[*QUESTION, without_ids], reward=0.0),
            Trajectory(
                messages_and_choices=[
                    *QUESTION,
                    {"role": "assistant", "content": plain.message.content or ""},
                    {"role": "user", "content": "Are you sure?"},
                    plain,
                ],
                reward=0.5,
            ),
        ]
    )
    assert group.trajectories[2].client_choices[0].message_index == 3  # only the Choice
    result = await client_model.train([group])
    assert result.stats.trained
    r = result.rendering
    exact = len(with_ids.model_extra["token_ids"])
    assert r["client_trajectories"] == 3
    assert r["tokens_retokenized"] == result.stats.sampled_tokens - exact - len(
        plain.model_extra["token_ids"]
    )
    # Sampler log-probs line up for the exact ids and for most re-tokenized ones.
    assert r["tokens_without_sampler_logprobs"] < r["tokens_retokenized"]
    # The mismatch is measured on the tokens that have one, the NaN ones left out.
    assert math.isfinite(result.stats.mismatch_abs_mean) and result.stats.mismatch_abs_max > 0
    answer = await client_model.openai_client().chat.completions.create(
        model=client_model.name, messages=QUESTION, max_tokens=4
    )
    assert answer.model == f"{client_model.name}@{result.step}"


async def test_messages_no_template_renders_are_refused(client_model):
    call = {"type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}
    no_id = Trajectory(
        messages=[*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]}],
        reward=1.0,
    )
    with pytest.raises(TrainingDataError) as error:
        await client_model.train([TrajectoryGroup([no_id, Trajectory(reward=0.0)])])
    text = str(error.value)
    assert repr(no_id.id) in text and "message 1" in text and "tool call without an id" in text
    assert "fix:" in text
    odd_role = Trajectory(
        messages=[
            *QUESTION,
            {"role": "function", "content": "5"},
            {"role": "assistant", "content": "5"},
        ]
    )
    with pytest.raises(TrainingDataError, match=r"message 1 \(role 'function'\).*fix: use system"):
        await client_model.train([TrajectoryGroup([odd_role, Trajectory(reward=1.0)])])
