"""The policy endpoint passes the engine's answer through as bytes (gateway.py): the
served name spliced in without parsing, the recorded copy parsed only when taken."""

import json

from rlcoach.endpoint.gateway import _renamed
from rlcoach.endpoint.recorder import Recorder
from rlcoach.engines import fastjson


def _answer(model: str, content: str) -> bytes:
    body = {
        "id": "chatcmpl-1",
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
    }
    return json.dumps(body, separators=(",", ":")).encode()


def test_the_served_name_replaces_the_engine_name_and_nothing_else():
    tricky = 'he said "model":"base" and {"model":"base"}'  # escaped inside the string
    raw = _answer("base", tricky)
    out = _renamed(raw, "base", "agent@3")
    assert json.loads(out) == {**json.loads(raw), "model": "agent@3"}
    assert json.loads(out)["choices"][0]["message"]["content"] == tricky
    slashed = _answer("Qwen/Qwen3-4B", "hi")
    assert json.loads(_renamed(slashed, "Qwen/Qwen3-4B", "q@1"))["model"] == "q@1"
    assert _renamed(raw, "base", "base") is raw
    spaced = json.dumps({"model": "base", "choices": []}).encode()  # `"model": "base"`
    assert _renamed(spaced, "base", "agent@3") is None  # the caller parses instead


def test_a_raw_answer_is_parsed_when_its_rollout_takes_it():
    recorder = Recorder()
    raw = _answer("agent@1", "hello")
    recorder.add_raw("r1", {"model": "agent"}, raw, {"rlcoach_timing": {"latency_s": 0.5}})
    recorder.add("r1", {"model": "agent"}, {"model": "agent@1", "choices": []})
    (first, second) = recorder.take("r1")
    assert (first.request, first.response) == ({"model": "agent"}, json.loads(raw))
    assert first.timing == {"latency_s": 0.5}  # beside the OpenAI-shaped answer, not inside
    assert second.response == {"model": "agent@1", "choices": []}
    assert recorder.take("r1") == []


def test_fastjson_round_trips():
    value = {"a": [1, 2.5, "é", None, True], "b": {"c": -1e-9}}
    assert fastjson.loads(fastjson.dumps(value)) == value
    assert fastjson.loads('{"x": 1}') == {"x": 1}


def test_the_collector_pause_nests_and_restores_the_state_it_found():
    import gc

    assert gc.isenabled()
    with fastjson.gc_paused():
        with fastjson.gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with fastjson.gc_paused():
            pass
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()
