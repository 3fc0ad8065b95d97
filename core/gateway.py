"""The policy endpoint: an OpenAI-compatible ASGI app in front of the inference engine.

User code (an OpenAI client, a LangGraph app, an MCP agent) talks to this gateway as to
any OpenAI server. On every chat completion the gateway forces per-token logprobs and
sampled token ids, routes `name@step` to the right adapter (see `router.py`), and records
the exchange under the rollout id that the client sent in the `X-RLCoach-Rollout` header
(`model.openai_client()` sets it from the current rollout scope), so user code needs no
bookkeeping. Bad requests get OpenAI-shaped 4xx errors that name the bad value and the
fix. Streaming is served from one upstream completion cut into SSE chunks.

The gateway runs uvicorn in a thread with its own event loop, so a user loop that blocks
(a synchronous reward function, a training step) never stalls in-flight requests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import socket
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rlcoach import fastjson
from rlcoach.engines.base import Engine, EngineHTTPError
from rlcoach.errors import ConfigError, EngineError, EngineStartError, UnknownModelError
from rlcoach.router import Router
from rlcoach.types import TIMING_KEY

__all__ = ["ROLLOUT_HEADER", "Gateway", "Recorder"]

logger = logging.getLogger(__name__)

ROLLOUT_HEADER = "x-rlcoach-rollout"

T = TypeVar("T")

Exchange = tuple[dict[str, Any], dict[str, Any]]
"""One recorded call: the client's request body and the response it got."""


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


class Recorder:
    """Exchanges (request, response) per rollout id, in arrival order. Thread-safe.

    A response may be kept as the engine's raw JSON (`add_raw`), parsed only when the
    rollout takes its exchanges (with the garbage collector paused, `fastjson.gc_paused`):
    parsing a 512-token answer with logprobs makes thousands of Python objects, and doing
    it on the way out made the answer wait for it and the collector walk every parsed
    answer still held (most of the endpoint's time, bench/gateway_overhead.py).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._exchanges: dict[str, list[tuple[dict[str, Any], Any]]] = defaultdict(list)

    def add(self, rollout_id: str, request: dict[str, Any], response: dict[str, Any]) -> None:
        with self._lock:
            self._exchanges[rollout_id].append((request, response))

    def add_raw(
        self, rollout_id: str, request: dict[str, Any], raw: bytes, extra: dict[str, Any]
    ) -> None:
        """Keep a response as its JSON bytes, with `extra` keys added when parsed."""
        with self._lock:
            self._exchanges[rollout_id].append((request, (raw, extra)))

    def take(self, rollout_id: str) -> list[Exchange]:
        with self._lock:
            kept = self._exchanges.pop(rollout_id, [])
        with fastjson.gc_paused():
            return [(request, _parsed(response)) for request, response in kept]


def _parsed(response: Any) -> dict[str, Any]:
    if isinstance(response, tuple):
        raw, extra = response
        return {**fastjson.loads(raw), **extra}
    return response


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
    n = body.get("n", 1)
    if n is not None and (not isinstance(n, int) or n < 1):
        return f"`n` must be a positive integer, got {n!r}"
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        return (
            f"`tool_choice`={choice!r} is not supported by the policy endpoint (forcing a call "
            "would train on tokens the policy did not choose); use 'auto' or 'none'"
        )
    return None


class Gateway:
    """The ASGI app plus the thread that serves it."""

    def __init__(
        self, engine: Engine, router: Router, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.engine = engine
        self.router = router
        self.recorder = Recorder()
        self.host = host
        self.port = port
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
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
        problem = _check_body(body)
        if problem is not None:
            return error_response(400, problem)
        try:
            served, engine_name = await self.router.acquire(body["model"])
        except UnknownModelError as e:
            return error_response(404, str(e), param="model", code="model_not_found")
        except EngineError as e:
            return _unavailable(e)
        upstream = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        upstream.update(model=engine_name, logprobs=True, return_token_ids=True)
        try:
            raw = await self._chat_bytes(upstream)
        except EngineHTTPError as e:
            return JSONResponse(e.body, status_code=e.status)
        except EngineError as e:
            return _unavailable(e)
        finally:
            await self.router.release(engine_name)
        # The answer passes through as bytes: parsed only for streaming, or when its
        # `model` is not where expected; recorded unparsed (see Recorder).
        renamed = _renamed(raw, engine_name, served)
        if renamed is None:
            response = fastjson.loads(raw)
            response["model"] = served
            renamed = fastjson.dumps(response)
        rollout_id = request.headers.get(ROLLOUT_HEADER)
        if rollout_id:
            timing = {"started_at": received, "latency_s": time.perf_counter() - clock}
            self.recorder.add_raw(rollout_id, body, renamed, {TIMING_KEY: timing})
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(
                _as_sse(fastjson.loads(renamed), include_usage), media_type="text/event-stream"
            )
        return Response(renamed, media_type="application/json")

    async def _chat_bytes(self, upstream: dict[str, Any]) -> bytes:
        """The engine's answer as JSON bytes (`chat_bytes` where the engine has it: vLLM's
        own bytes, never parsed here)."""
        chat_bytes = getattr(self.engine, "chat_bytes", None)
        if callable(chat_bytes):
            return await chat_bytes(upstream)
        return fastjson.dumps(await self.engine.chat(upstream))

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
        return JSONResponse({"exchanges": [{"request": q, "response": r} for q, r in exchanges]})

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

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro` on the gateway's loop from any other loop."""
        return await asyncio.wrap_future(self.submit(coro))

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


async def _as_sse(response: dict[str, Any], include_usage: bool) -> AsyncIterator[bytes]:
    """Cut one finished completion into chat.completion.chunk events."""
    head = {k: response[k] for k in ("id", "created", "model") if k in response}
    head["object"] = "chat.completion.chunk"

    def event(payload: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    for choice in response["choices"]:
        message = choice.get("message") or {}
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        calls = message.get("tool_calls") or []
        if calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
        first = {
            **head,
            "choices": [
                {
                    "index": choice["index"],
                    "delta": delta,
                    "logprobs": choice.get("logprobs"),
                    "finish_reason": None,
                    "token_ids": choice.get("token_ids"),
                }
            ],
            "prompt_token_ids": response.get("prompt_token_ids"),
        }
        yield event(first)
        last = {
            **head,
            "choices": [
                {
                    "index": choice["index"],
                    "delta": {},
                    "finish_reason": choice.get("finish_reason"),
                }
            ],
        }
        yield event(last)
    if include_usage:
        yield event({**head, "choices": [], "usage": response.get("usage")})
    yield b"data: [DONE]\n\n"
