"""RemoteBackend's pieces that need no server: key scoping, error mapping, wire round trips."""

import math

import httpx
import pytest

from rlcoach import Model, RemoteBackend
from rlcoach.errors import ConfigError, RemoteError, TrainingDataError
from rlcoach.serve.remote import _error, key_for_url
from rlcoach.serve.wire import SFTRequest, StepResultWire, TrainEvent, TrainRequest
from rlcoach.trajectory.trajectories import ChatRecord, Trajectory


def test_the_server_key_goes_only_to_that_server():
    backend = RemoteBackend("http://gpu-box:8000/", "k-123")
    assert key_for_url("http://gpu-box:8000/v1") == "k-123"
    assert Model("judge", base_url="http://gpu-box:8000/v1").api_key == "k-123"
    assert key_for_url("http://gpu-box:80000/v1") is None
    assert key_for_url("https://api.example.com/v1") is None
    assert Model("judge", base_url="https://api.example.com/v1").api_key == "none"
    del backend


def test_a_bad_url_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="http://"):
        RemoteBackend("gpu-box:8000")


@pytest.mark.parametrize(
    "status,code,kind,retryable",
    [
        (401, "invalid_api_key", ConfigError, None),
        (400, "invalid_name", ConfigError, None),
        (413, "too_large", TrainingDataError, None),
        (429, "busy", RemoteError, True),
        (503, "engine_unavailable", RemoteError, True),
        (500, None, RemoteError, True),
    ],
)
def test_refusals_become_rlcoach_errors(status, code, kind, retryable):
    body = {"error": {"message": "no", "type": "x", "param": None, "code": code}}
    error = _error(httpx.Response(status, json=body))
    assert isinstance(error, kind) and "answered" in str(error)
    if retryable is not None:
        assert error.retryable is retryable


def test_wire_types_round_trip_nan_and_refuse_bad_request_ids():
    event = TrainEvent(
        event="result",
        request_id="abcdefgh",
        result=StepResultWire(step=1, stats={"loss": math.nan, "trained": False}),
    )
    back = TrainEvent.model_validate_json(event.model_dump_json())
    assert math.isnan(back.result.stats["loss"]) and back.result.stats["trained"] is False
    model = {"name": "m", "project": "p", "base_model": "b"}
    for bad in ("../../x", "short", "a" * 65):
        with pytest.raises(ValueError):
            TrainRequest(request_id=bad, model=model, groups=[])


def test_sft_examples_keep_their_kind_and_order_on_the_wire():
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    examples = [
        ChatRecord(messages=chat),
        Trajectory(messages=chat, reward=1.0),
        ChatRecord(messages=chat, metadata={"source": "teacher"}),
    ]
    request = SFTRequest(
        request_id="abcdefgh",
        examples=examples,
        model={"name": "m", "project": "p", "base_model": "b"},
    )
    back = SFTRequest.model_validate_json(request.model_dump_json())
    assert [type(e) for e in back.examples] == [ChatRecord, Trajectory, ChatRecord]
    assert back.examples == examples
    with pytest.raises(ValueError, match="messages"):  # a chat record without messages
        SFTRequest.model_validate({**request.model_dump(), "examples": [{"tools": None}]})
