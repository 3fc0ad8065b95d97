"""The gateway's bounds: the recorder of exchanges, the chat-body checks, `call`'s timeout."""

import asyncio
import json
import time

import pytest

from rlcoach.endpoint.gateway import Gateway, _check_body
from rlcoach.endpoint.recorder import Recorder
from rlcoach.endpoint.router import Router
from rlcoach.errors import EngineError


def test_the_recorder_keeps_at_most_max_rollouts_and_counts_what_it_drops():
    recorder = Recorder(max_rollouts=2, max_exchanges=2)
    for rollout in ("a", "b", "c"):
        recorder.add(rollout, {"q": rollout}, {})
    for _ in range(3):
        recorder.add("c", {}, {})
    assert recorder.take("a") == []  # the least recently touched went first
    assert len(recorder.take("c")) == 2
    assert recorder.counters() == {
        "recorder_rollouts": 1,
        "recorder_rollouts_expired": 0,
        "recorder_rollouts_evicted": 1,
        "recorder_exchanges_dropped": 3,
    }


def test_a_rollout_nobody_takes_expires():
    recorder = Recorder(ttl_s=0.05)
    recorder.add("late", {}, {})
    time.sleep(0.1)
    assert recorder.counters()["recorder_rollouts_expired"] == 1
    assert recorder.take("late") == []


@pytest.mark.parametrize(
    "field,value",
    [
        ("n", 10**6),
        ("n", True),
        ("top_logprobs", 21),
        ("max_tokens", "many"),
        ("max_tokens", 0),
        ("temperature", float("nan")),
        ("temperature", 3.0),
        ("top_p", -1),
        ("stop", 5),
        ("seed", 10**30),
    ],
)
def test_sampling_options_are_bounded(field, value):
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], field: value}
    problem = _check_body(json.loads(json.dumps(body)))
    assert problem is not None and f"`{field}`" in problem


class IdleEngine:
    base_name = "base"


async def test_a_call_to_the_gateway_loop_has_a_timeout():
    engine = IdleEngine()
    gateway = Gateway(engine, Router(engine, 1), call_timeout_s=0.2)  # type: ignore[arg-type]
    gateway.start()
    try:
        with pytest.raises(EngineError, match="did not finish within"):
            await gateway.call(asyncio.sleep(30))
        assert await gateway.call(asyncio.sleep(0, result=7)) == 7
    finally:
        gateway.stop()
