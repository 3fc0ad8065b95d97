"""`rlcoach serve`: the backend over HTTP, for user code on other machines.

One process on the GPU machine holds a `LocalBackend` (engine, gateway, trainer) and
answers:

    GET    /health                                   no key: engine up or not
    POST   /v1/chat/completions, GET /v1/models     the policy endpoint (proxied to the gateway)
    POST   /rlcoach/v1/models                        register a model (idempotent)
    POST   /rlcoach/v1/train                         a batch of groups in, NDJSON events out
    POST   /rlcoach/v1/train_sft                     examples to imitate in, the same events out
    POST   /rlcoach/v1/rollouts/{id}                 a rollout's recorded exchanges
    GET    /rlcoach/v1/models/{project}/{name}/checkpoints     list
    DELETE /rlcoach/v1/models/{project}/{name}/checkpoints/{step}
    GET    /rlcoach/v1/models/{project}/{name}/metrics          the step records
    GET    /rlcoach/v1/metrics, /rlcoach/v1/status  server counters, engine state

Choices, and why:
- Every route but `/health` wants the API key (`Authorization: Bearer`, as OpenAI
  clients send it, or `X-API-Key`), compared in constant time and never logged. The
  default bind is 127.0.0.1; exposing the server without a key logs a warning.
- Names from requests are checked as single safe path components before any path is
  built, and every checkpoint path is checked to lie under the root. The base model is
  the one the server was started with; a client cannot point the server at a folder.
- Bodies are read as a stream and cut off at the size limit (413). Chat requests wait
  for one of `max_concurrent_chats` engine slots in a bounded queue; a full queue or a
  wait past `queue_timeout_s` answers 429 (OpenAI clients retry it). All errors are
  OpenAI-shaped.
- Training (RL or SFT) is idempotent per request id: the groups or examples are written
  to disk before the upload is acknowledged, the step runs as a task of its own (a client
  that hangs up does not cancel it), one step per model at a time, and the result is
  kept on disk. A retry of an id that is running attaches to it; a retry of a finished
  id gets the first result, found in the result file or in the checkpoint's step record
  (which is renamed into place with the adapter, so a kill -9 between the rename and the
  answer loses nothing). After a restart the model resumes from its latest complete
  checkpoint.
- The gateway stays what it is (its own thread and loop, a private port on 127.0.0.1);
  this server forwards to it. A crashed vLLM is restarted by the backend's supervisor;
  meanwhile chat requests fail fast with a retryable 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from rlcoach.backend import LocalBackend, StepResult
from rlcoach.bundled import BUNDLED_MODEL
from rlcoach.config import EngineConfig, check_name
from rlcoach.errors import ConfigError, EngineError, RLCoachError, TrainingDataError
from rlcoach.gateway import ROLLOUT_HEADER
from rlcoach.model import TrainableModel
from rlcoach.paths import DEFAULT_ROOT, RunPaths, write_text_atomic
from rlcoach.step_records import finished_step, list_checkpoints, step_result_wire
from rlcoach.wire import (
    API_PREFIX,
    API_VERSION,
    CheckpointList,
    ModelRef,
    RegisterResponse,
    SFTRequest,
    StepResultWire,
    TrainEvent,
    TrainRequest,
    error_body,
)

__all__ = ["PolicyServer", "ServeConfig", "serve"]

logger = logging.getLogger(__name__)

MiB = 1024 * 1024


class ServeConfig(BaseModel):
    """How `rlcoach serve` listens and what it accepts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    """Interface to bind; anything but loopback exposes the server (use a key)."""
    port: int = Field(8000, ge=0, le=65535)
    root: Path = DEFAULT_ROOT
    """Where runs are written (checkpoints, trajectories, metrics)."""
    base_model: str = BUNDLED_MODEL
    """The one base model this server serves (bundled name or a local folder)."""
    engine: EngineConfig = Field(default_factory=EngineConfig)
    max_request_bytes: int = Field(64 * MiB, ge=1024)
    """Largest training upload; bigger answers 413."""
    max_chat_bytes: int = Field(8 * MiB, ge=1024)
    """Largest chat request; bigger answers 413."""
    max_concurrent_chats: int = Field(256, ge=1)
    """Chat requests sent to the engine at once; more wait in the queue."""
    max_queued_chats: int = Field(1024, ge=0)
    """Chat requests allowed to wait; one more answers 429."""
    queue_timeout_s: float = Field(300.0, gt=0.0)
    """Longest wait for an engine slot; longer answers 429."""
    max_pending_trains: int = Field(4, ge=1)
    """Training requests uploading or running at once; one more answers 429."""
    heartbeat_s: float = Field(5.0, gt=0.0)
    """Seconds between heartbeat events while a step runs."""
    upstream_timeout_s: float = Field(600.0, gt=0.0)
    """Timeout of each call to the gateway (and so to the engine)."""


class _Refusal(Exception):
    """An HTTP error to answer with an OpenAI-shaped body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.param, self.kind = status, code, param, kind

    def response(self) -> JSONResponse:
        body = error_body(str(self), kind=self.kind, param=self.param, code=self.code)
        headers = {"Retry-After": "5"} if self.status in (429, 503) else None
        return JSONResponse(body, status_code=self.status, headers=headers)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _KeyGuard:
    """ASGI middleware: every route but /health needs the key (constant-time compare)."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self.key = api_key.encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.key is None or scope["path"] == "/health":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        given = headers.get(b"x-api-key", b"")
        bearer = headers.get(b"authorization", b"")
        if bearer[:7].lower() == b"bearer ":
            given = bearer[7:].strip()
        # compare_digest on equal-length inputs only would leak the length; on bytes of
        # any length it does not short-circuit on content.
        if not hmac.compare_digest(given, self.key):
            message = ("missing API key" if not given else "invalid API key") + (
                ": send `Authorization: Bearer <key>` with the key the server was started "
                "with ($RLCOACH_API_KEY on the server); fix: RemoteBackend(url, api_key=...) "
                "or export RLCOACH_API_KEY"
            )
            response = JSONResponse(error_body(message, code="invalid_api_key"), status_code=401)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class PolicyServer:
    """The app behind `rlcoach serve` and the state it keeps."""

    def __init__(
        self, config: ServeConfig, api_key: str | None, backend: LocalBackend | None = None
    ) -> None:
        self.config = config
        self.backend = backend or LocalBackend(config.root, engine=config.engine)
        self.root = self.backend.root.resolve()
        self.models: dict[str, TrainableModel] = {}
        self.counters: Counter[str] = Counter()
        self._slots = asyncio.Semaphore(config.max_concurrent_chats)
        self._waiting = 0
        self._active = 0
        self._trains: dict[str, asyncio.Task[StepResultWire]] = {}
        self._uploads = 0
        self._model_locks: dict[str, asyncio.Lock] = {}
        self._register_lock = asyncio.Lock()
        self._upstream: httpx.AsyncClient | None = None
        self.started = time.time()
        p = API_PREFIX
        model_path = p + "/models/{project}/{name}"
        routes = [
            Route("/health", self._health, methods=["GET"]),
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/models", self._list_served, methods=["GET"]),
            Route(p + "/models", self._register, methods=["POST"]),
            Route(p + "/train", self._train, methods=["POST"]),
            Route(p + "/train_sft", self._train_sft, methods=["POST"]),
            Route(p + "/rollouts/{rollout_id}", self._take_rollout, methods=["POST"]),
            Route(model_path + "/checkpoints", self._checkpoints, methods=["GET"]),
            Route(model_path + "/checkpoints/{step}", self._delete_checkpoint, methods=["DELETE"]),
            Route(model_path + "/metrics", self._model_metrics, methods=["GET"]),
            Route(p + "/metrics", self._metrics, methods=["GET"]),
            Route(p + "/status", self._status, methods=["GET"]),
        ]
        app = Starlette(
            routes=routes,
            lifespan=self._lifespan,
            exception_handlers={
                _Refusal: self._crash,
                ClientDisconnect: self._crash,
                HTTPException: self._http_error,
                Exception: self._crash,
            },
        )
        self.app = _KeyGuard(app, api_key)

    # -- lifecycle -----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.backend.start(self.config.base_model)
        self._upstream = httpx.AsyncClient(
            base_url=self.backend.url,
            timeout=httpx.Timeout(self.config.upstream_timeout_s),
            limits=httpx.Limits(
                max_connections=self.config.max_concurrent_chats + 16, max_keepalive_connections=64
            ),
        )
        try:
            yield
        finally:
            await self._upstream.aclose()
            await self.backend.close()

    # -- helpers -------------------------------------------------------------------------

    async def _read(self, request: Request, limit: int) -> bytes:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            self.counters["rejected_too_large"] += 1
            raise _Refusal(
                413,
                f"the request body has {int(length)} bytes, over the server's "
                f"limit of {limit}; fix: send fewer groups per step, or start the "
                "server with a larger --max-request-mb",
                code="too_large",
            )
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                self.counters["rejected_too_large"] += 1
                raise _Refusal(
                    413,
                    f"the request body is over the server's limit of {limit} "
                    "bytes; fix: send less per request, or raise the server's "
                    "limit (--max-request-mb)",
                    code="too_large",
                )
            chunks.append(chunk)
        return b"".join(chunks)

    @staticmethod
    def _parse(model: type[BaseModel], raw: bytes) -> Any:
        try:
            return model.model_validate_json(raw)
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}"
                for err in e.errors()[:5]
            )
            raise _Refusal(
                400,
                f"the body is not a valid {model.__name__} ({problems}); fix: "
                "send what RemoteBackend sends (rlcoach.wire)",
            ) from e

    def _run_paths(self, project: str, name: str) -> RunPaths:
        try:
            check_name("project", project)
            check_name("model", name)
        except ConfigError as e:
            raise _Refusal(400, str(e), param="name", code="invalid_name") from e
        paths = RunPaths(self.root, project, name)
        self._inside_root(paths.dir)
        return paths

    def _inside_root(self, path: Path) -> Path:
        resolved = path.resolve()
        if not resolved.is_relative_to(self.root):
            raise _Refusal(
                400, f"path {str(path)!r} is outside the server's root", code="invalid_path"
            )
        return resolved

    async def _model(self, ref: ModelRef) -> TrainableModel:
        async with self._register_lock:
            known = self.models.get(ref.name)
            if known is not None:
                if known.project != ref.project:
                    raise _Refusal(
                        409,
                        f"model {ref.name!r} is registered under project "
                        f"{known.project!r}, not {ref.project!r}; fix: use another "
                        "model name",
                        code="name_taken",
                    )
                return known
            try:
                model = TrainableModel(ref.name, ref.project, ref.base_model, ref.config)
                await self.backend.register(model)
            except ConfigError as e:
                raise _Refusal(400, str(e), code="invalid_model") from e
            self.models[ref.name] = model
            return model

    # -- handlers: service ---------------------------------------------------------------

    async def _health(self, request: Request) -> Response:
        gateway = self.backend.gateway
        if gateway is None:
            raise _Refusal(503, "the backend is starting", kind="server_error")
        if gateway.router.unavailable is not None:
            raise _Refusal(
                503, gateway.router.unavailable, kind="server_error", code="engine_unavailable"
            )
        if not await gateway.call(gateway.engine.healthy()):
            raise _Refusal(
                503,
                "the inference engine is not answering",
                kind="server_error",
                code="engine_unavailable",
            )
        return JSONResponse({"status": "ok", "api_version": API_VERSION})

    async def _status(self, request: Request) -> Response:
        engine = self.backend.engine
        supervisor = self.backend.supervisor
        return JSONResponse(
            {
                "api_version": API_VERSION,
                "base_model": self.backend.base_model,
                "engine": {
                    "kind": self.config.engine.kind,
                    "pid": getattr(engine, "pid", None),
                    "url": getattr(engine, "url", None),
                    "restarts": supervisor.restarts if supervisor else 0,
                },
                "models": {
                    name: {"project": m.project, "step": m.step} for name, m in self.models.items()
                },
                "uptime_s": time.time() - self.started,
            }
        )

    async def _metrics(self, request: Request) -> Response:
        return JSONResponse(
            {
                **self.counters,
                "chats_active": self._active,
                "chats_waiting": self._waiting,
                "trains_running": len(self._trains),
                "engine_restarts": self.backend.supervisor.restarts
                if self.backend.supervisor
                else 0,
            }
        )

    # -- handlers: the policy endpoint ---------------------------------------------------

    async def _chat(self, request: Request) -> Response:
        body = await self._read(request, self.config.max_chat_bytes)
        c = self.config
        if self._waiting + self._active >= c.max_concurrent_chats + c.max_queued_chats:
            self.counters["rejected_busy"] += 1
            raise _Refusal(
                429,
                f"the server holds {self._active} running and {self._waiting} "
                "queued chat requests, its limit; retry shortly (or start it with a "
                "larger --max-queued-chats)",
                code="busy",
                kind="rate_limit_error",
            )
        self._waiting += 1
        try:
            await asyncio.wait_for(self._slots.acquire(), c.queue_timeout_s)
        except TimeoutError as e:
            self.counters["rejected_queue_timeout"] += 1
            raise _Refusal(
                429,
                f"no engine slot freed within {c.queue_timeout_s:.0f} s; retry shortly",
                code="queue_timeout",
                kind="rate_limit_error",
            ) from e
        finally:
            self._waiting -= 1
        self._active += 1
        streaming = False
        try:
            headers = {"content-type": "application/json"}
            rollout = request.headers.get(ROLLOUT_HEADER)
            if rollout:
                headers[ROLLOUT_HEADER] = rollout
            assert self._upstream is not None
            sent = self._upstream.build_request(
                "POST", "/v1/chat/completions", content=body, headers=headers
            )
            try:
                upstream = await self._upstream.send(sent, stream=True)
            except httpx.HTTPError as e:
                raise _Refusal(
                    503,
                    f"the policy endpoint did not answer ({e!r}); retry shortly",
                    kind="server_error",
                    code="engine_unavailable",
                ) from e
            self.counters[f"chat_{upstream.status_code}"] += 1
            out = {k: v for k, v in upstream.headers.items() if k.lower() == "retry-after"}
            media_type = upstream.headers.get("content-type")
            if upstream.status_code == 200 and "text/event-stream" in (media_type or ""):
                # Token by token: relay each event as it comes; the slot is held until the
                # stream ends.
                streaming = True
                return StreamingResponse(self._relay(upstream), media_type=media_type)
            try:
                content = await upstream.aread()
            finally:
                await upstream.aclose()
            return Response(
                content, status_code=upstream.status_code, headers=out, media_type=media_type
            )
        finally:
            if not streaming:
                self._active -= 1
                self._slots.release()

    async def _relay(self, upstream: httpx.Response) -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        finally:
            await upstream.aclose()
            self._active -= 1
            self._slots.release()

    async def _list_served(self, request: Request) -> Response:
        assert self._upstream is not None
        upstream = await self._upstream.get("/v1/models")
        return Response(
            upstream.content, status_code=upstream.status_code, media_type="application/json"
        )

    async def _take_rollout(self, request: Request) -> Response:
        exchanges = await self.backend.take_exchanges(request.path_params["rollout_id"])
        return JSONResponse({"exchanges": [{"request": q, "response": r} for q, r in exchanges]})

    # -- handlers: models, training, checkpoints -----------------------------------------

    async def _register(self, request: Request) -> Response:
        ref = self._parse(ModelRef, await self._read(request, self.config.max_chat_bytes))
        model = await self._model(ref)
        answer = RegisterResponse(
            served_name=model.served_name, step=model.step, base_model=model.base_model
        )
        return Response(answer.model_dump_json(), media_type="application/json")

    async def _train(self, request: Request) -> Response:
        train = self._parse(TrainRequest, await self._upload(request))
        if not train.groups:
            raise _Refusal(
                400, "`groups` is empty; fix: send at least one trajectory group", param="groups"
            )

        def step(model: TrainableModel) -> Awaitable[StepResult]:
            return self.backend.train(
                model, train.groups, train.config, request_id=train.request_id
            )

        return await self._start(train.request_id, train.model, train.groups, step, "rl")

    async def _train_sft(self, request: Request) -> Response:
        sft = self._parse(SFTRequest, await self._upload(request))
        if not sft.examples:
            raise _Refusal(
                400,
                "`examples` is empty; fix: send at least one trajectory or chat record",
                param="examples",
            )

        def step(model: TrainableModel) -> Awaitable[StepResult]:
            return self.backend.train_sft(
                model, sft.examples, sft.config, request_id=sft.request_id
            )

        return await self._start(sft.request_id, sft.model, sft.examples, step, "sft")

    async def _upload(self, request: Request) -> bytes:
        """A training body, within the size limit and the count of pending requests."""
        if len(self._trains) + self._uploads >= self.config.max_pending_trains:
            self.counters["rejected_busy"] += 1
            raise _Refusal(
                429,
                f"{self.config.max_pending_trains} training requests are "
                "already uploading or running; retry once one finishes",
                code="busy",
                kind="rate_limit_error",
            )
        self._uploads += 1
        try:
            return await self._read(request, self.config.max_request_bytes)
        finally:
            self._uploads -= 1

    async def _start(
        self,
        request_id: str,
        ref: ModelRef,
        items: Sequence[BaseModel],
        step: Callable[[TrainableModel], Awaitable[StepResult]],
        kind: str,
    ) -> Response:
        """Run `step` once per request id; answer with its events (or its first result)."""
        self._run_paths(ref.project, ref.name)
        model = await self._model(ref)
        task = self._trains.get(request_id)
        if task is None:
            paths = self._run_paths(model.project, model.name)
            finished = await asyncio.to_thread(finished_step, paths, request_id, self.root)
            if finished is not None:
                self.counters["train_replayed"] += 1
                event = TrainEvent(event="result", request_id=request_id, result=finished)
                return Response(event.model_dump_json() + "\n", media_type="application/x-ndjson")
            # The upload is on disk before it is acknowledged (the first event).
            await asyncio.to_thread(
                write_text_atomic,
                paths.dir / "requests" / f"{request_id}.jsonl",
                "".join(item.model_dump_json() + "\n" for item in items),
            )
            task = asyncio.create_task(self._run_step(model, request_id, step, kind, paths))
            self._trains[request_id] = task
            task.add_done_callback(lambda _: self._trains.pop(request_id, None))
            self.counters["train_started"] += 1
        else:
            self.counters["train_attached"] += 1
        return StreamingResponse(self._events(request_id, task), media_type="application/x-ndjson")

    async def _run_step(
        self,
        model: TrainableModel,
        request_id: str,
        step: Callable[[TrainableModel], Awaitable[StepResult]],
        kind: str,
        paths: RunPaths,
    ) -> StepResultWire:
        lock = self._model_locks.setdefault(model.name, asyncio.Lock())
        async with lock:
            wire = step_result_wire(await step(model), self.root, kind)
            await asyncio.to_thread(
                write_text_atomic,
                paths.dir / "requests" / f"{request_id}.result.json",
                wire.model_dump_json(),
            )
            return wire

    async def _events(
        self, request_id: str, task: asyncio.Task[StepResultWire]
    ) -> AsyncIterator[bytes]:
        def line(event: TrainEvent) -> bytes:
            return (event.model_dump_json() + "\n").encode()

        yield line(TrainEvent(event="accepted", request_id=request_id))
        yield line(TrainEvent(event="training", request_id=request_id))
        # asyncio.wait never cancels the task: a client that hangs up leaves the step running.
        while not task.done():
            await asyncio.wait({task}, timeout=self.config.heartbeat_s)
            if not task.done():
                yield line(TrainEvent(event="heartbeat", request_id=request_id))
        error = task.exception() if not task.cancelled() else EngineError("the step was cancelled")
        if error is None:
            yield line(TrainEvent(event="result", request_id=request_id, result=task.result()))
            return
        retryable = isinstance(error, EngineError | OSError) or not isinstance(error, RLCoachError)
        if isinstance(error, TrainingDataError | ConfigError):
            retryable = False
        logger.error("training request %s failed: %r", request_id, error)
        self.counters["train_failed"] += 1
        body = error_body(
            f"{type(error).__name__}: {error}",
            kind="invalid_request_error" if not retryable else "server_error",
        )
        yield line(
            TrainEvent(
                event="error", request_id=request_id, error=body["error"], retryable=retryable
            )
        )

    async def _checkpoints(self, request: Request) -> Response:
        p = request.path_params
        paths = self._run_paths(p["project"], p["name"])
        listed = await asyncio.to_thread(list_checkpoints, paths, self.root)
        latest = max((c.step for c in listed), default=0)
        served = self.models.get(p["name"])
        latest = served.step if served is not None and served.project == p["project"] else latest
        for info in listed:
            info.served = info.step == latest
        return Response(
            CheckpointList(checkpoints=listed, latest=latest).model_dump_json(),
            media_type="application/json",
        )

    async def _delete_checkpoint(self, request: Request) -> Response:
        p = request.path_params
        paths = self._run_paths(p["project"], p["name"])
        step_text = p["step"]
        if not step_text.isdigit() or int(step_text) < 1:
            raise _Refusal(
                400, f"checkpoint step {step_text!r} is not a positive integer", param="step"
            )
        step = int(step_text)
        model = self.models.get(p["name"])
        latest = paths.latest_checkpoint()
        if (model is not None and model.step == step) or (latest and latest[0] == step):
            raise _Refusal(
                409,
                f"step {step} is the latest checkpoint (the one served as "
                f"{p['name']!r}); fix: train a newer step first",
                code="checkpoint_in_use",
            )
        folder = self._inside_root(paths.checkpoint(step))
        if not folder.is_dir():
            raise _Refusal(
                404, f"{p['project']}/{p['name']} has no checkpoint {step}", code="not_found"
            )
        gateway = self.backend.gateway
        if gateway is not None:
            gateway.router.checkpoints.pop(f"{p['name']}@{step}", None)
        await asyncio.to_thread(shutil.rmtree, folder)
        self.counters["checkpoints_deleted"] += 1
        return JSONResponse({"deleted": step})

    async def _model_metrics(self, request: Request) -> Response:
        p = request.path_params
        paths = self._run_paths(p["project"], p["name"])
        records = []
        if paths.metrics.is_file():
            text = await asyncio.to_thread(paths.metrics.read_text, encoding="utf-8")
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        return JSONResponse({"records": records})

    # -- errors --------------------------------------------------------------------------

    async def _http_error(self, request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        message = f"{request.method} {request.url.path}: {error.detail}"
        if error.status_code == 404:
            message += f"; the rlcoach routes live under {API_PREFIX} and /v1"
        return JSONResponse(
            error_body(message, code="not_found" if error.status_code == 404 else None),
            status_code=error.status_code,
        )

    async def _crash(self, request: Request, error: Exception) -> Response:
        if isinstance(error, _Refusal):
            return error.response()
        if isinstance(error, ClientDisconnect):
            self.counters["client_disconnects"] += 1
            return Response(status_code=400)  # nobody is listening
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(
            error_body(f"internal error: {type(error).__name__}: {error}", kind="server_error"),
            status_code=500,
        )


def serve(config: ServeConfig, api_key: str | None) -> None:
    """Run the server until SIGINT/SIGTERM (the CLI's `rlcoach serve`)."""
    import uvicorn

    if api_key is None:
        if _is_loopback(config.host):
            logger.warning(
                "no API key set ($RLCOACH_API_KEY): anyone on this machine can use "
                "the server on %s:%d",
                config.host,
                config.port,
            )
        else:
            logger.warning(
                "SERVING ON %s WITHOUT AN API KEY: anyone who can reach port %d "
                "can train and query your models; fix: export RLCOACH_API_KEY=...",
                config.host,
                config.port,
            )
    server = PolicyServer(config, api_key)
    uvicorn.run(
        server.app,
        host=config.host,
        port=config.port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=30,
    )
