"""ART's spellings work as ART writes them: trajectories from `messages_and_choices`,
groups from coroutines, ART's gather keywords, `beta`, `_internal_config` and `_config`,
judges named `provider/model`, and the evaluation records behind `model.log`.

The judge test sends a real HTTP request to the `scripted` chat-completions server on
127.0.0.1 (through `OPENAI_BASE_URL`, the OpenAI SDK's own variable) in place of
api.openai.com, which this machine cannot reach.
"""

import asyncio

import pytest
from openai.types.chat.chat_completion import Choice
from pydantic import BaseModel

import rlcoach as art
from rlcoach import (
    ConfigError,
    RolloutError,
    TrainableModel,
    TrainConfig,
    Trajectory,
    TrajectoryGroup,
    gather_trajectories,
    gather_trajectory_groups,
    iterate_dataset,
)
from rlcoach.backend.evaluation import eval_record
from rlcoach.backend.retention import read_metric, steps_to_keep
from rlcoach.compat.art_config import internal_config, train_options
from rlcoach.providers import provider_model
from rlcoach.ruler import score_group


def _choice(text: str, logprobs: list[float] | None = None, **extra) -> Choice:
    content = None
    if logprobs is not None:
        content = [
            {"token": f"t{i}", "logprob": lp, "bytes": None, "top_logprobs": []}
            for i, lp in enumerate(logprobs)
        ]
    return Choice.model_validate(
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": text, "refusal": None},
            "logprobs": {"content": content} if content is not None else None,
            **extra,
        }
    )


def test_messages_and_choices_build_a_trajectory_and_stay_live():
    user = {"role": "user", "content": "2+2?"}
    t = Trajectory(messages_and_choices=[user, _choice("4", [-0.1])], reward=1)
    assert t.messages() == [user, {"role": "assistant", "content": "4"}]
    assert t.client_choices[0].message_index == 1
    assert t.client_choices[0].logprobs == [-0.1]
    t.messages_and_choices.append({"role": "user", "content": "and 3+3?"})
    t.messages_and_choices.append(_choice("6", token_ids=[21]))
    assert [c.message_index for c in t.client_choices] == [1, 3]
    assert t.client_choices[1].token_ids == [21]
    assert isinstance(t.messages_and_choices[3], Choice)
    assert t.messages_and_choices[3].message.content == "6"
    del t.messages_and_choices[0]
    assert [c.message_index for c in t.client_choices] == [0, 2]
    t.reward += 1
    again = Trajectory.model_validate_json(t.model_dump_json())
    assert again.messages() == t.messages() and again.client_choices == t.client_choices


async def test_finish_and_track_duration_as_art_writes_them():
    t = Trajectory(messages=[{"role": "user", "content": "hi"}])
    async with t.track_duration("tool"):
        await asyncio.sleep(0.02)
    with t.track_duration("tool"):
        pass
    assert 0.02 <= t.metrics["tool_duration"] < 5
    assert t.finish() is t and t.finished_at is not None
    finished = t.finished_at
    assert t.finish().finished_at == finished  # the first time stays


def test_vllm_token_strings_give_token_ids():
    content = [
        {"token": "token_id:42", "logprob": -0.5, "bytes": None, "top_logprobs": []},
        {"token": "token_id:7", "logprob": -0.2, "bytes": None, "top_logprobs": []},
    ]
    choice = {"index": 0, "finish_reason": "stop", "logprobs": {"content": content}}
    choice["message"] = {"role": "assistant", "content": "ok"}
    t = Trajectory(messages_and_choices=[{"role": "user", "content": "?"}, choice])
    assert t.client_choices[0].token_ids == [42, 7]


def test_bad_messages_and_choices_are_refused_with_the_index():
    with pytest.raises(ValueError, match=r"messages_and_choices\[1\] is int"):
        Trajectory(messages_and_choices=[{"role": "user", "content": "?"}, 5])
    with pytest.raises(ValueError, match="does not point at an assistant message"):
        Trajectory(
            messages=[{"role": "user", "content": "?"}], client_choices=[{"message_index": 0}]
        )


async def _attempt(reward: float) -> Trajectory:
    await asyncio.sleep(0)
    if reward < 0:
        raise RuntimeError("tool server down")
    return Trajectory(reward=reward)


async def test_groups_from_coroutines_as_art_writes_them():
    alone = await TrajectoryGroup(_attempt(r) for r in (1.0, -1.0, 0.0))
    assert alone.rewards == [1.0, 0.0] and alone.exceptions[0].type == "RuntimeError"
    groups = await gather_trajectory_groups(
        (TrajectoryGroup(_attempt(r) for r in (0.0, 1.0)) for _ in range(3)),
        pbar_desc="gather",
        max_exceptions=0,
        progress=False,
    )
    assert [g.rewards for g in groups] == [[0.0, 1.0]] * 3
    with pytest.raises(RolloutError, match="above max_exceptions=1"):
        await gather_trajectory_groups(
            [TrajectoryGroup(_attempt(-1.0) for _ in range(2))], max_exceptions=1, progress=False
        )
    pending = TrajectoryGroup(_attempt(1.0) for _ in range(2))
    model = TrainableModel("m", "p")
    with pytest.raises(ConfigError, match="have not run"):
        await model.train([pending])
    await pending  # leaves no coroutine un-awaited


async def test_after_each_may_drop_or_split_and_gather_trajectories():
    async def split(group):
        return None if group.rewards == [0.0] else [group, group]

    groups = await gather_trajectory_groups(
        [[_attempt(0.0)], [_attempt(1.0)]], after_each=split, progress=False
    )
    assert [g.rewards for g in groups] == [[1.0], [1.0]]
    results = await gather_trajectories(
        (_attempt(r) for r in (1.0, -1.0)), max_exceptions=1, progress=False
    )
    assert results[0].reward == 1.0 and isinstance(results[1], RuntimeError)
    with pytest.raises(RuntimeError, match="tool server down"):
        await gather_trajectories((_attempt(r) for r in (1.0, -1.0)), progress=False)


def test_iterate_dataset_takes_arts_names():
    art = list(iterate_dataset(list(range(5)), groups_per_step=2, num_epochs=2, use_tqdm=True))
    ours = list(iterate_dataset(list(range(5)), 2, 2))
    assert [b.items for b in art] == [b.items for b in ours] and len(art) == 6
    assert [b.epoch_step for b in art] == [0, 1, 2, 0, 1, 2]


def test_beta_is_kl_coef():
    assert TrainConfig(beta=0.04).kl_coef == 0.04
    assert TrainConfig(kl_coef=0.1).beta == 0.1
    with pytest.raises(ValueError, match="same KL weight"):
        TrainConfig(beta=0.1, kl_coef=0.2)


def test_art_internal_config_and_train_options_map_onto_rlcoach_fields():
    model = TrainableModel(
        name="m",
        project="p",
        _internal_config={
            "init_args": {"max_seq_length": 8192, "load_in_4bit": True},
            "engine_args": {"gpu_memory_utilization": 0.8, "enforce_eager": True},
            "peft_args": {"r": 16, "lora_alpha": 32},
        },
    )
    # The same, written with ART's `art.dev` types (dicts, as in ART).
    as_art = TrainableModel(name="m", project="p")
    as_art._internal_config = art.dev.InternalModelConfig(
        init_args=art.dev.InitArgs(max_seq_length=8192, load_in_4bit=True),
        engine_args=art.dev.EngineArgs(gpu_memory_utilization=0.8, enforce_eager=True),
        peft_args=art.dev.PeftArgs(r=16, lora_alpha=32),
    )
    assert as_art.engine_overrides == model.engine_overrides
    assert as_art.config == model.config
    with pytest.raises(AttributeError, match=r"'TinkerArgs'.*fix: set rlcoach's configs"):
        art.dev.TinkerArgs  # noqa: B018
    with pytest.raises(AttributeError, match=r"'LocalAPI' \(an OpenPipe ART name\).*LocalBackend"):
        art.LocalAPI  # noqa: B018
    assert model.engine_overrides == {
        "max_model_len": 8192,
        "gpu_memory_utilization": 0.8,
        "extra_args": ["--enforce-eager"],
    }
    assert (model.config.lora.rank, model.config.lora.alpha) == (16, 32)
    with pytest.raises(ConfigError, match=r"'engine_args.swap_space'.*LocalBackend\(engine="):
        internal_config({"engine_args": {"swap_space": 4}})
    step_options = art.dev.TrainConfig(logprob_calculation_chunk_size=8, epsilon_high=0.3)
    assert train_options(step_options) == {
        "logprob_chunk_tokens": 16,
        "clip_high": 0.3,
    }
    with pytest.raises(ConfigError, match="'importance_sampling_level'"):
        train_options({"importance_sampling_level": "sequence"})

    class Settings(BaseModel):
        groups_per_step: int = 2

    with pytest.raises(ConfigError, match="ART's `config=` holds your own settings"):
        TrainableModel("m", "p", config=Settings())


def test_eval_records_and_which_checkpoints_stay(tmp_path):
    group = TrajectoryGroup([Trajectory(reward=1.0, metrics={"acc": 1.0}), Trajectory(reward=0.0)])
    record = eval_record([group], "val", {"loss": 0.5, "train/x": 2.0})
    assert record["event"] == "eval" and record["val/reward"] == 0.5
    assert record["val/acc"] == 1.0 and record["val/loss"] == 0.5 and record["train/x"] == 2.0
    metrics = tmp_path / "metrics.jsonl"
    lines = [(1, "eval", 0.2), (2, "eval", 0.9), (2, "eval", 0.7), (3, "eval", 0.4)]
    lines += [(0, "eval", 1.0), (4, "skipped", 5.0)]  # no checkpoint 0; a skip is no step
    metrics.write_text(
        "".join(f'{{"step": {s}, "event": "{e}", "val/reward": {v}}}\n' for s, e, v in lines)
        + "torn line\n"
    )
    scores = read_metric(metrics, "val/reward")
    assert scores == {0: 1.0, 1: 0.2, 2: 0.8, 3: 0.4}
    assert steps_to_keep([1, 2, 3, 4], 4, keep_best=1, scores=scores) == {2, 4}
    assert steps_to_keep([1, 2, 3, 4], 4, keep_best=1, scores=scores, mode="min", keep_last=2) == {
        1,
        3,
        4,
    }
    assert steps_to_keep([1, 2, 3, 4], 4) == {4}


async def test_a_judge_named_provider_slash_model(scripted, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", scripted.model.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    judge = provider_model("openai/gpt-4.1")
    assert (judge.name, judge.api_key_env) == ("gpt-4.1", "OPENAI_API_KEY")
    scripted.answer = lambda request: (
        '{"1": {"explanation": "right", "score": 0.9}, "2": {"explanation": "wrong", "score": 0.1}}'
    )
    group = TrajectoryGroup(
        [
            Trajectory(
                messages=[{"role": "user", "content": "2+2"}, {"role": "assistant", "content": a}]
            )
            for a in ("4", "5")
        ]
    )
    scored = await score_group(group, "openai/gpt-4.1", config={"cache_dir": None}, debug=True)
    assert scripted.requests[0]["model"] == "gpt-4.1"
    assert sorted(scored.rewards) == [0.1, 0.9]
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ConfigError, match=r"\$OPENAI_API_KEY, which is not set"):
        await score_group(group, "openai/gpt-4.1", config={"cache_dir": None})
    with pytest.raises(ConfigError, match="not a `provider/model` name"):
        provider_model("gpt-4.1")
