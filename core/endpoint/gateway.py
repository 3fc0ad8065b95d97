"""The policy endpoint: an OpenAI-compatible ASGI app in front of the inference engine.

User code (an OpenAI client, a LangGraph app, an MCP agent) talks to this gateway as to
any OpenAI server. On every chat completion the gateway forces per-token logprobs and
sampled token ids, routes `name@step` to the right adapter (see `router.py`), and records
the exchange (recorder.py) under the rollout id that the client sent in the
`X-RLCoach-Rollout` header (`model.openai_client()` sets it from the current rollout
scope), so user code needs no bookkeeping. Bad requests get OpenAI-shaped 4xx errors that
name the bad value and the fix. The client gets log-probs only when it asked for them
(`constraint.as_asked`); the recording keeps them all. What is recorded is what the
trainer can trust:

- Streaming is token by token: each engine event is relayed as it comes, and the
  completion the events add up to is recorded when the stream ends (stream.py).
- A completion sampled under a grammar (JSON schema, regex, a forced tool choice) is
  recorded with the model's own log-probs, re-scored without the grammar (or left to the
  trainer, where the engine's prompt pass is slow: a CPU), and with the positions the
  grammar forced (constraint.py, rescore.py); the client gets the engine's answer, with
  the top log-probs it asked for.
- A forced tool choice (`required`, a named tool) is sampled under the endpoint's own
  grammar of the model family's call envelope around schema-true arguments, and answered
  as tool calls read from the sampled text (call_grammar.py); a tool schema the grammar
  cannot hold, or a named tool that is not offered, is a 400 before sampling.
- A tool-calling reply the policy sampled earlier in the same rollout, returned by the
  client as parsed tool calls, is sent to the engine as the exact text it sampled: the
  chat template would re-serialise the calls its own way (spacing, key order, escapes,
  the envelope), so the next prompt would not extend the sampled tokens and the trainer
  would need a second sequence re-reading the prompt.

The gateway runs uvicorn in a thread with its own event loop, so a user loop that blocks
(a synchronous reward function, a training step) never stalls in-flight requests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any, Literal, TypeVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rlcoach.endpoint.call_grammar import ForcedCall, as_calls, forced_call, with_tool_calls
from rlcoach.endpoint.constraint import (
    as_asked,
    normalize_tool_choice,
    sampling_constraint,
    strict_tools,
    tool_choice_problem,
    unknown_tool_problem,
)
from rlcoach.endpoint.recorder import Recorder
from rlcoach.endpoint.rescore import RescoreGate, constrained_choices
from rlcoach.endpoint.router import Router
from rlcoach.endpoint.schema_support import check_tool_schema
from rlcoach.endpoint.scoring import prompt_logprobs_response
from rlcoach.engines import fastjson
from rlcoach.engines.base import Engine, EngineHTTPError
from rlcoach.engines.stream import DONE, CompletionAssembler, sse_event
from rlcoach.errors import (
    ConfigError,
    EngineError,
    EngineStartError,
    ToolSchemaError,
    UnknownModelError,
)
from rlcoach.trajectory.histories import message_key
from rlcoach.trajectory.trajectories import CHOICE_KEY, TIMING_KEY

__all__ = ["EVALUATION_HEADER", "ROLLOUT_HEADER", "Gateway", "Recorder"]

logger = logging.getLogger(__name__)

ROLLOUT_HEADER = "x-rlcoach-rollout"
EVALUATION_HEADER = "x-rlcoach-evaluation"
"""`1` on a call of an evaluation rollout: its constrained replies are not re-scored."""

T = TypeVar("T")


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    kind: str = "invalid_request_error",
) -> JSONResponse:
    """An error body shaped like OpenAI's, so every OpenAI client raises the right class."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def _renamed(raw: bytes, engine_name: str, served: str) -> bytes | None:
    """The engine's answer with its `model` changed to the served name, without parsing
    it: inside a JSON string every quote is escaped, so the unescaped token
    `"model":"<name>"` can only be the key itself. None when it is not there as expected
    (the caller parses instead)."""
    if engine_name == served:
        return raw
    old = b'"model":' + fastjson.dumps(engine_name)
    at = raw.find(old)
    if at < 0:
        return None
    return raw[:at] + b'"model":' + fastjson.dumps(served) + raw[at + len(old) :]


def _unavailable(error: Exception) -> JSONResponse:
    """503 with `Retry-After`: the engine is down or restarting; the same request may work
    in a moment (OpenAI clients retry 503 on their own)."""
    response = error_response(
        503, f"{error}; retry shortly", kind="server_error", code="engine_unavailable"
    )
    response.headers["Retry-After"] = "5"
    return response


_INTEGER_FIELDS = (
    ("n", 1, 128),
    ("max_tokens", 1, 1 << 20),
    ("max_completion_tokens", 1, 1 << 20),
    ("top_logprobs", 0, 20),
    ("seed", -(1 << 63), (1 << 63) - 1),
)
"""Integer fields of a chat request and their bounds (OpenAI's where it has them)."""

_NUMBER_FIELDS = (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0))


def _check_body(body: Any) -> str | None:
    """Return what is wrong with a chat-completion body, or None."""
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "`model` must be a non-empty string such as 'my-agent@3' or 'my-agent'"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "`messages` must be a non-empty list of chat messages"
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return f"`messages[{index}]` must be an object with a string `role`, got {message!r}"
    for field, low, high in _INTEGER_FIELDS:
        value = body.get(field)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high
        ):
            bounds = (
                f"a positive integer up to {high}"
                if low == 1
                else f"an integer from {low} to {high}"
            )
            return f"`{field}` must be {bounds}, got {value!r:.40}"
    for field, least, most in _NUMBER_FIELDS:
        number = body.get(field)
        if number is not None and (
            not isinstance(number, int | float)
            or isinstance(number, bool)
            or not least <= number <= most  # also refuses NaN
        ):
            return f"`{field}` must be a number from {least} to {most}, got {number!r:.40}"
    stop = body.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(x, str) for x in stop))
    ):
        return f"`stop` must be a string or a list of strings, got {stop!r:.60}"
    return tool_choice_problem(body.get("tool_choice")) or unknown_tool_problem(body)


class Gateway:
    """The ASGI app plus the thread that serves it."""

    def __init__(
        self,
        engine: Engine,
        router: Router,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        recorder: Recorder | None = None,
        call_timeout_s: float = 600.0,
    ) -> None:
        self.engine = engine
        self.router = router
        self.recorder = recorder or Recorder()
        alone = bool(getattr(engine, "rescore_alone", False))
        self._gate = RescoreGate(enabled=alone)
        # Who computes a constrained completion's own log-probs (rescore.py).
        self.constrained_logprobs: Literal["engine", "trainer"] = "trainer" if alone else "engine"
        self.call_timeout_s = call_timeout_s
        """Default limit of `call` (an engine start passes its own)."""
        self.host = host
        self.port = port
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._score, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/health", self._health, methods=["GET"]),
                Route("/rlcoach/rollouts/{rollout_id}", self._take_rollout, methods=["POST"]),
            ]
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: Any = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- HTTP handlers -------------------------------------------------------------------

    async def _chat(self, request: Request) -> Response:
        received, clock = time.time(), time.perf_counter()
        try:
            body = fastjson.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return error_response(400, f"the request body is not valid JSON: {e}")
        except RecursionError:
            return error_response(400, "the request body nests JSON too deeply for a chat")
        problem = _check_body(body)
        if problem is not None:
            return error_response(400, problem)
        body = normalize_tool_choice(body)
        try:
            forced = await self._forced_call(body)
        except ToolSchemaError as e:
            return error_response(400, str(e), param="tools", code="unsupported_schema")
        if forced is not None and (conflict := forced.conflict(body)) is not None:
            return error_response(
                400, conflict, param="tool_choice", code="conflicting_constraints"
            )
        try:
            served, engine_name = await self.router.acquire(body["model"])
        except UnknownModelError as e:
            return error_response(404, str(e), param="model", code="model_not_found")
        except EngineError as e:
            return _unavailable(e)
        await self._gate.enter()
        call = _Call(body, served, engine_name, request.headers.get(ROLLOUT_HEADER), received)
        call.forced = forced
        call.evaluation = request.headers.get(EVALUATION_HEADER) == "1"
        streaming = False
        try:
            upstream = await self._upstream_body(call)
            if body.get("stream"):
                events = self._relay(call, upstream, clock)
                streaming = True  # from here the relay releases the adapter when it ends
                try:
                    first = await anext(events)
                except EngineHTTPError as e:
                    return JSONResponse(e.body, status_code=e.status)
                except EngineError as e:
                    return _unavailable(e)
                return StreamingResponse(_chained(first, events), media_type="text/event-stream")
            if call.constraint is None:
                return await self._pass_through(call, upstream, clock)
            try:
                response = await self.engine.chat(upstream)
            except EngineHTTPError as e:
                return JSONResponse(e.body, status_code=e.status)
            except EngineError as e:
                return _unavailable(e)
            response["model"] = served
            if forced is not None:
                response["choices"] = [
                    with_tool_calls(c, forced, forced.tool_calls(_text(c)))
                    for c in response["choices"]
                ]
            await self._record(call, response, time.perf_counter() - clock)
        finally:
            if not streaming:
                await self._gate.leave()
                await self.router.release(engine_name)
        return JSONResponse(as_asked(response, body))

    async def _forced_call(self, body: dict[str, Any]) -> ForcedCall | None:
        """The grammar-held forced call this request asks for (call_grammar.py), where the
        engine samples under grammars (vLLM: it names its tool-call parser), bounded to
        the reply's token budget (call_budget.py). Raises `ToolSchemaError` for a tool
        whose schema no grammar could hold, forced or strict."""
        parser = getattr(self.engine, "tool_call_parser", None)
        if parser is None:
            return None
        for name, schema in strict_tools(body):
            check_tool_schema(name, schema)
        forced = forced_call(body, parser)
        if forced is None:
            return None
        budget = body.get("max_completion_tokens") or body.get("max_tokens")
        if budget is None:
            budget = await self._context_room(body)
        return dataclasses.replace(forced, budget=budget)

    async def _context_room(self, body: dict[str, Any]) -> int | None:
        """The tokens the engine's context leaves after this request's prompt (what it
        samples at most without `max_tokens`); None where the engine does not say."""
        length = getattr(self.engine, "prompt_length", None)
        context = getattr(getattr(self.engine, "config", None), "max_model_len", None)
        if length is None or context is None:
            return None
        try:
            used = await length(self.engine.base_name, body)
        except (EngineError, EngineHTTPError) as e:
            logger.warning("could not count a prompt's tokens (%s); call not bounded", e)
            return None
        return max(1, int(context) - used)

    async def _pass_through(self, call: _Call, upstream: dict[str, Any], clock: float) -> Response:
        """An unconstrained answer passes through as the engine's bytes when the client
        asked for log-probs (parsed only when its `model` is not where expected), else
        without them; it is recorded unparsed, log-probs and all (see Recorder)."""
        try:
            raw = await self._chat_bytes(upstream)
        except EngineHTTPError as e:
            return JSONResponse(e.body, status_code=e.status)
        except EngineError as e:
            return _unavailable(e)
        # As it came when the client asked for log-probs (then all it gets is what it asked
        # for); else parsed, to leave them out (see `as_asked`).
        answer = _renamed(raw, call.engine_name, call.served) if call.body.get("logprobs") else None
        if answer is None:
            with fastjson.gc_paused():
                try:
                    response = fastjson.loads(raw)
                except ValueError:
                    response = None
                if not isinstance(response, dict):
                    return _unavailable(
                        EngineError(f"the engine answered a chat completion with {raw[:200]!r}")
                    )
                response["model"] = call.served
                answer = fastjson.dumps(as_asked(response, call.body))
        if call.rollout_id:
            timing = {"started_at": call.received, "latency_s": time.perf_counter() - clock}
            extra = {TIMING_KEY: timing, "model": call.served}
            self.recorder.add_raw(call.rollout_id, call.body, raw, extra)
        return Response(answer, media_type="application/json")

    async def _chat_bytes(self, upstream: dict[str, Any]) -> bytes:
        """The engine's answer as JSON bytes (`chat_bytes` where the engine has it: vLLM's
        own bytes, never parsed here)."""
        chat_bytes = getattr(self.engine, "chat_bytes", None)
        if callable(chat_bytes):
            return await chat_bytes(upstream)
        return fastjson.dumps(await self.engine.chat(upstream))

    async def _upstream_body(self, call: _Call) -> dict[str, Any]:
        """The body the engine gets: logprobs and token ids always; two top log-probs per
        position under a grammar (to see what it forced); earlier sampled tool calls as
        the text that was sampled."""
        body = call.body
        upstream = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        upstream.update(model=call.engine_name, logprobs=True, return_token_ids=True)
        if body.get("stream"):
            upstream["stream"] = True
            if body.get("stream_options"):
                upstream["stream_options"] = body["stream_options"]
        if call.constraint is not None:
            upstream["top_logprobs"] = max(int(body.get("top_logprobs") or 0), 2)
        if call.rollout_id:
            upstream["messages"] = await self._verbatim(call.rollout_id, body["messages"])
        if call.forced is not None:
            upstream = call.forced.upstream(upstream)
        return upstream

    async def _verbatim(
        self, rollout_id: str, messages: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """`messages` with each assistant turn that returns a tool-calling reply sampled in
        this rollout replaced by the reply's sampled text (see the module docstring)."""
        replies = self.recorder.replies(rollout_id)
        if not replies:
            return messages
        out = []
        for message in messages:
            choice = None
            if message.get("role") == "assistant" and message.get("tool_calls"):
                choice = replies.get(message_key(message))
            text = await self._sampled_text(choice) if choice is not None else None
            if text is not None:
                message = {"role": "assistant", "content": text}
            out.append(message)
        return out

    async def _sampled_text(self, choice: dict[str, Any]) -> str | None:
        """The text of a recorded choice's sampled tokens without the end-of-turn token the
        chat template writes itself; None when it cannot be rebuilt (a stop string)."""
        extra = choice.setdefault(CHOICE_KEY, {})
        if "text" in extra:
            return extra["text"]
        ids = list(choice.get("token_ids") or [])
        if isinstance(choice.get("stop_reason"), str) or not ids:
            return None  # the text ends before tokens that were sampled: no verbatim form
        if choice.get("finish_reason") in ("stop", "tool_calls"):
            ids = ids[:-1]  # the end-of-turn (stop) token, which the template adds back
        try:
            extra["text"] = await self.engine.detokenize(self.engine.base_name, ids)
        except (EngineError, EngineHTTPError) as e:
            logger.warning("could not detokenize a sampled reply (%s); sent as parsed", e)
            return None
        return extra["text"]

    async def _relay(
        self, call: _Call, upstream: dict[str, Any], clock: float
    ) -> AsyncIterator[bytes]:
        """Relay the engine's events as they come; record the completion at the end."""
        assembler = CompletionAssembler()
        made: dict[int, list[dict[str, Any]]] = {}  # the tool calls of a forced call
        try:
            async for chunk in self.engine.chat_stream(upstream):
                assembler.add(chunk)
                chunk["model"] = call.served
                if call.forced is not None:
                    chunk = as_calls(chunk, call.forced, assembler, made)
                yield sse_event(as_asked(chunk, call.body))
            if assembler.finished:
                completion = assembler.completion()
                completion["model"] = call.served
                if call.forced is not None:
                    completion["choices"] = [
                        with_tool_calls(c, call.forced, made.get(c["index"], []))
                        for c in completion["choices"]
                    ]
                await self._record(call, completion, time.perf_counter() - clock)
            elif call.rollout_id:
                logger.warning("a streamed completion ended without a finish; not recorded")
            yield DONE
        finally:
            await self._gate.leave()
            await self.router.release(call.engine_name)

    async def _record(self, call: _Call, response: dict[str, Any], latency_s: float) -> None:
        """Keep the exchange under its rollout id (constrained choices re-scored first,
        unless the rollout is an evaluation: then kept out of the loss as sampled)."""
        if not call.rollout_id:
            return
        timing = {"started_at": call.received, "latency_s": latency_s}
        recorded = {**response, TIMING_KEY: timing}
        if call.constraint is not None:
            by = "evaluation" if call.evaluation else self.constrained_logprobs
            recorded["choices"] = await constrained_choices(
                response, call.constraint, by, self.engine, self._gate, call.engine_name
            )
        self.recorder.add(call.rollout_id, call.body, recorded)

    async def _score(self, request: Request) -> Response:
        # A teacher's prompt log-probs (scoring.py); nothing generated or recorded.
        return await prompt_logprobs_response(request, self.router, self.engine, self._gate)

    async def _models(self, request: Request) -> Response:
        now = int(time.time())
        data = [
            {"id": name, "object": "model", "created": now, "owned_by": "rlcoach"}
            for name in self.router.served_names()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def _health(self, request: Request) -> Response:
        if await self.engine.healthy():
            return JSONResponse({"status": "ok"})
        return error_response(503, "the inference engine is not answering", kind="server_error")

    async def _take_rollout(self, request: Request) -> Response:
        exchanges = self.recorder.take(request.path_params["rollout_id"])
        return JSONResponse({"exchanges": [e.as_wire() for e in exchanges]})

    # -- the serving thread --------------------------------------------------------------

    def start(self) -> None:
        """Start uvicorn in its own thread and event loop; return once it listens."""
        import uvicorn

        if self.port:
            with socket.socket() as probe:
                try:
                    probe.bind((self.host, self.port))
                except OSError as e:
                    raise ConfigError(
                        f"port {self.port} on {self.host} is already in use ({e.strerror}); "
                        "fix: stop the process holding it or use EngineConfig(port=0) "
                        "to pick a free port"
                    ) from e
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level="warning", lifespan="off", timeout_keep_alive=30
        )
        self._server = uvicorn.Server(config)
        ready = threading.Event()
        self._loop = _event_loop()

        def serve() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.call_soon(ready.set)
            self._loop.run_until_complete(self._server.serve(sockets=[sock]))

        self._thread = threading.Thread(target=serve, name="rlcoach-gateway", daemon=True)
        self._thread.start()
        ready.wait()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise EngineStartError(f"the gateway did not start on {self.url}")
            time.sleep(0.01)
        logger.info("policy endpoint listening on %s/v1", self.url)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run `coro` on the gateway's loop (engine and router live there)."""
        if self._loop is None:
            raise EngineError("the gateway is not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Await `coro` on the gateway's loop from any other loop, for at most `timeout_s`
        (default `call_timeout_s`); past it the coroutine is cancelled and `EngineError`
        raised, so no caller waits forever on a wedged engine."""
        limit = self.call_timeout_s if timeout_s is None else timeout_s
        name = getattr(coro, "__qualname__", "a call")
        future = self.submit(coro)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), limit)
        except TimeoutError as e:
            future.cancel()
            raise EngineError(
                f"{name} did not finish within {limit:.0f} s on the policy endpoint's loop; "
                "the engine may be wedged (its log says more)"
            ) from e

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._loop is not None and not self._loop.is_closed() and not self._loop.is_running():
            self._loop.close()
        self._thread = None


def _event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop where it is installed (vLLM brings it): its sockets and callbacks cost
    about half of asyncio's per request (bench/gateway_overhead.py)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class _Call:
    """One chat request in flight: what it asked for and where it is routed."""

    __slots__ = (
        "body",
        "constraint",
        "engine_name",
        "evaluation",
        "forced",
        "received",
        "rollout_id",
        "served",
    )

    def __init__(
        self,
        body: dict[str, Any],
        served: str,
        engine_name: str,
        rollout_id: str | None,
        received: float,
    ) -> None:
        self.body = body
        self.served = served
        self.engine_name = engine_name
        self.rollout_id = rollout_id
        self.received = received
        self.constraint = sampling_constraint(body)
        self.forced: ForcedCall | None = None
        self.evaluation = False


def _text(choice: dict[str, Any]) -> str:
    return (choice.get("message") or {}).get("content") or ""


async def _chained(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for event in rest:
        yield event
