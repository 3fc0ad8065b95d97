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
  clients send it, or `X-API-Key`), compared in constant time and never logged; requests
  from web pages (an `Origin` header) and, on loopback, with a foreign `Host` are refused
  (access.py). The default bind is 127.0.0.1; binding anything else without a key is
  refused unless `--insecure`. `--ssl-certfile`/`--ssl-keyfile` serve HTTPS.
- Names from requests are checked as single safe path components before any path is
  built, and every checkpoint path is checked to lie under the root. The base model is
  the one the server was started with; a client cannot point the server at a folder.
- Bodies are read as a stream and cut off at the size limit (413). Chat requests wait
  for one of `max_concurrent_chats` engine slots in a bounded queue; a full queue or a
  wait past `queue_timeout_s` answers 429 (OpenAI clients retry it). All errors are
  OpenAI-shaped.
- Training input is checked (training_input.py: token ids in the vocabulary, calls within
  `max_model_len`, finite rewards and log-probs) before anything is written; a refusal is
  a 400 `invalid_training_data` that clients do not retry.
- Training (RL or SFT) is idempotent per request id: claimed before the first await,
  written to disk before it is acknowledged, run as a task of its own, one step per
  model at a time, a retry attached or replayed, retryable only when its error says so,
  and the retention policy applied after each step (training_requests.py).
- Registered models are kept in their run folders and registered again at start-up, each
  at its latest complete checkpoint (registrations.py).
- Hostile input gets a 4xx with a message, never a 500: numbers are parsed only from
  ASCII digits of bounded length, JSON nesting is bounded, a torn metrics line is skipped.
- The gateway stays what it is (its own thread and loop, a private port on 127.0.0.1);
  this server forwards to it. A crashed vLLM is restarted by the backend's supervisor;
  meanwhile chat requests fail fast with a retryable 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rlcoach.backend.local import LocalBackend, StepResult
from rlcoach.backend.retention import remove_checkpoint
from rlcoach.backend.training_input import TrainingLimits, check_examples, check_groups
from rlcoach.config import check_name
from rlcoach.endpoint.gateway import EVALUATION_HEADER, ROLLOUT_HEADER
from rlcoach.errors import ConfigError, TrainingDataError
from rlcoach.model import TrainableModel
from rlcoach.models.served_name import ServedName
from rlcoach.paths import RunPaths
from rlcoach.serve.access import AccessGuard, check_exposure, is_loopback
from rlcoach.serve.refusal import Refusal
from rlcoach.serve.registrations import Registrations
from rlcoach.serve.serve_config import ServeConfig
from rlcoach.serve.step_records import list_checkpoints
from rlcoach.serve.training_requests import Step, TrainingRequests, stop_serving
from rlcoach.serve.wire import (
    API_PREFIX,
    API_VERSION,
    CheckpointList,
    LogRequest,
    ModelRef,
    RegisterResponse,
    SFTRequest,
    TrainRequest,
    error_body,
)

__all__ = ["PolicyServer", "ServeConfig", "serve"]

logger = logging.getLogger(__name__)

_NUMBER = re.compile(r"[0-9]{1,15}")
"""A number in a path or header: ASCII digits ("²".isdigit() is True), bounded length."""


class PolicyServer:
    """The app behind `rlcoach serve` and the state it keeps."""

    def __init__(
        self, config: ServeConfig, api_key: str | None, backend: LocalBackend | None = None
    ) -> None:
        self.config = config
        self.backend = backend or LocalBackend(config.root, engine=config.engine)
        self.root = self.backend.root.resolve()
        self.counters: Counter[str] = Counter()
        self.registrations = Registrations(self.backend, self.root, self._run_paths)
        self.models = self.registrations.models
        self.trains = TrainingRequests(
            self.backend,
            self.root,
            self.counters,
            max_pending=config.max_pending_trains,
            heartbeat_s=config.heartbeat_s,
            retention=config.retention,
        )
        self._slots = asyncio.Semaphore(config.max_concurrent_chats)
        self._waiting = 0
        self._active = 0
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
            Route(p + "/log", self._log, methods=["POST"]),
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
                Refusal: self._crash,
                ClientDisconnect: self._crash,
                HTTPException: self._http_error,
                Exception: self._crash,
            },
        )
        self.app = AccessGuard(
            app,
            api_key,
            bind_host=config.host,
            allowed_hosts=config.allowed_hosts,
            allowed_origins=config.allowed_origins,
        )

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
        await self.registrations.register_again()
        try:
            yield
        finally:
            await self.trains.cancel_all()
            await self._upstream.aclose()
            await self.backend.close()

    # -- helpers -------------------------------------------------------------------------

    async def _read(self, request: Request, limit: int) -> bytes:
        length = request.headers.get("content-length")
        if length is not None and not _NUMBER.fullmatch(length):
            raise Refusal(400, f"Content-Length {length[:40]!r} is not a byte count")
        if length is not None and int(length) > limit:
            self.counters["rejected_too_large"] += 1
            raise Refusal(
                413,
                f"the request body has {int(length)} bytes, over the server's "
                f"limit of {limit}; fix: send fewer groups per step, or start the "
                "server with a larger --max-request-mb",
                code="too_large",
            )
        chunks, size = [], 0
        timeout = self.config.upload_timeout_s
        try:
            async with asyncio.timeout(timeout):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        self.counters["rejected_too_large"] += 1
                        raise Refusal(
                            413,
                            f"the request body is over the server's limit of {limit} "
                            "bytes; fix: send less per request, or raise the server's "
                            "limit (--max-request-mb)",
                            code="too_large",
                        )
                    chunks.append(chunk)
        except TimeoutError as e:
            # A body that trickles in holds a slot of max_pending_trains (and memory).
            self.counters["rejected_slow_upload"] += 1
            raise Refusal(
                408,
                f"the request body did not arrive within {timeout:.0f} s ({size} bytes "
                "came); nothing was kept — fix: send it again over a faster link, or "
                "start the server with a larger --upload-timeout-s",
                code="upload_timeout",
            ) from e
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
            raise Refusal(
                400,
                f"the body is not a valid {model.__name__} ({problems}); fix: "
                "send what RemoteBackend sends (rlcoach.serve.wire)",
            ) from e

    def _run_paths(self, project: str, name: str) -> RunPaths:
        try:
            check_name("project", project)
            check_name("model", name)
        except ConfigError as e:
            raise Refusal(400, str(e), param="name", code="invalid_name") from e
        paths = RunPaths(self.root, project, name)
        self._inside_root(paths.dir)
        return paths

    def _inside_root(self, path: Path) -> Path:
        resolved = path.resolve()
        if not resolved.is_relative_to(self.root):
            raise Refusal(
                400, f"path {str(path)!r} is outside the server's root", code="invalid_path"
            )
        return resolved

    # -- handlers: service ---------------------------------------------------------------

    async def _health(self, request: Request) -> Response:
        gateway = self.backend.gateway
        if gateway is None:
            raise Refusal(503, "the backend is starting", kind="server_error")
        if gateway.router.unavailable is not None:
            raise Refusal(
                503, gateway.router.unavailable, kind="server_error", code="engine_unavailable"
            )
        if not await gateway.call(gateway.engine.healthy(), timeout_s=10.0):
            raise Refusal(
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
                "trains_running": self.trains.running,
                **(self.backend.gateway.recorder.counters() if self.backend.gateway else {}),
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
            raise Refusal(
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
            raise Refusal(
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
            for name in (ROLLOUT_HEADER, EVALUATION_HEADER):
                if value := request.headers.get(name):
                    headers[name] = value
            assert self._upstream is not None
            sent = self._upstream.build_request(
                "POST", "/v1/chat/completions", content=body, headers=headers
            )
            try:
                upstream = await self._upstream.send(sent, stream=True)
            except httpx.HTTPError as e:
                raise Refusal(
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
        try:
            upstream = await self._upstream.get("/v1/models")
        except httpx.HTTPError as e:
            raise Refusal(
                503,
                f"the policy endpoint did not answer ({e!r}); retry shortly",
                kind="server_error",
                code="engine_unavailable",
            ) from e
        return Response(
            upstream.content, status_code=upstream.status_code, media_type="application/json"
        )

    async def _take_rollout(self, request: Request) -> Response:
        exchanges = await self.backend.take_exchanges(request.path_params["rollout_id"])
        return JSONResponse({"exchanges": [e.as_wire() for e in exchanges]})

    # -- handlers: models, training, checkpoints -----------------------------------------

    async def _register(self, request: Request) -> Response:
        ref = self._parse(ModelRef, await self._read(request, self.config.max_chat_bytes))
        model = await self.registrations.register(ref)
        answer = RegisterResponse(
            served_name=model.served_name, step=model.step, base_model=model.base_model
        )
        return Response(answer.model_dump_json(), media_type="application/json")

    async def _train(self, request: Request) -> Response:
        train = self._parse(TrainRequest, await self._upload(request))
        if not train.groups:
            raise Refusal(
                400, "`groups` is empty; fix: send at least one trajectory group", param="groups"
            )

        await self._check_input(check_groups, train.groups)

        def step(model: TrainableModel) -> Awaitable[StepResult]:
            return self.backend.train(
                model, train.groups, train.config, request_id=train.request_id
            )

        return await self._start(train.request_id, train.model, train.groups, step, "rl")

    async def _log(self, request: Request) -> Response:
        """`model.log` through the server: the groups and their record go to its sinks."""
        from rlcoach.trajectory.splits import check_split

        body = self._parse(LogRequest, await self._read(request, self.config.max_request_bytes))
        model = await self.registrations.register(body.model)
        record = await self.backend.log(
            model, body.groups, check_split(body.split), metrics=body.metrics, step=body.step
        )
        return JSONResponse({"record": record})

    async def _train_sft(self, request: Request) -> Response:
        sft = self._parse(SFTRequest, await self._upload(request))
        if not sft.examples:
            raise Refusal(
                400,
                "`examples` is empty; fix: send at least one trajectory or chat record",
                param="examples",
            )

        await self._check_input(check_examples, sft.examples)

        def step(model: TrainableModel) -> Awaitable[StepResult]:
            return self.backend.train_sft(
                model, sft.examples, sft.config, request_id=sft.request_id
            )

        return await self._start(sft.request_id, sft.model, sft.examples, step, "sft")

    async def _check_input(self, check: Callable[[Any, TrainingLimits], None], items: Any) -> None:
        """The training-input checks of training_input.py; a problem answers 400."""
        try:
            limits = await asyncio.to_thread(self.backend.training_limits)
            await asyncio.to_thread(check, items, limits)
        except TrainingDataError as e:
            self.counters["rejected_training_data"] += 1
            raise Refusal(400, str(e), code="invalid_training_data") from e

    async def _upload(self, request: Request) -> bytes:
        """A training body, within the size limit and the count of pending requests."""
        with self.trains.upload_slot():
            return await self._read(request, self.config.max_request_bytes)

    async def _start(
        self, request_id: str, ref: ModelRef, items: Sequence[BaseModel], step: Step, kind: str
    ) -> Response:
        """Run `step` once per request id; answer with its events (or its first result)."""
        self._run_paths(ref.project, ref.name)
        model = await self.registrations.register(ref)
        paths = self._run_paths(model.project, model.name)
        events = await self.trains.start(request_id, model, paths, items, step, kind)
        return StreamingResponse(events, media_type="application/x-ndjson")

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
        if not _NUMBER.fullmatch(step_text) or int(step_text) < 1:
            raise Refusal(
                400, f"checkpoint step {step_text[:40]!r} is not a positive integer", param="step"
            )
        step = int(step_text)
        model = self.models.get(p["name"])
        latest = paths.latest_checkpoint()
        if (model is not None and model.step == step) or (latest and latest[0] == step):
            raise Refusal(
                409,
                f"step {step} is the latest checkpoint (the one served as "
                f"{p['name']!r}); fix: train a newer step first",
                code="checkpoint_in_use",
            )
        folder = self._inside_root(paths.checkpoint(step))
        if not folder.is_dir():
            raise Refusal(
                404, f"{p['project']}/{p['name']} has no checkpoint {step}", code="not_found"
            )
        await stop_serving(self.backend.gateway, str(ServedName(p["name"], step)))
        await asyncio.to_thread(remove_checkpoint, folder)
        self.counters["checkpoints_deleted"] += 1
        return JSONResponse({"deleted": step})

    async def _model_metrics(self, request: Request) -> Response:
        p = request.path_params
        paths = self._run_paths(p["project"], p["name"])
        records, unreadable = [], 0
        if paths.metrics.is_file():
            text = await asyncio.to_thread(paths.metrics.read_text, encoding="utf-8")
            for line in text.splitlines():
                if not line.strip():
                    continue
                try:
                    records.append(json.loads(line))
                except (ValueError, RecursionError):  # a line torn by a crash
                    unreadable += 1
        # NaN stays NaN (a loss that was not finite), as on the training stream.
        body = json.dumps({"records": records, "unreadable_lines": unreadable})
        return Response(body, media_type="application/json")

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
        if isinstance(error, Refusal):
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

    check_exposure(config.host, api_key, config.insecure)
    if api_key is None:
        logger.warning(
            "no API key set ($RLCOACH_API_KEY): %s can use the server on %s:%d",
            "anyone on this machine" if is_loopback(config.host) else "ANYONE WHO CAN REACH IT",
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
        # Open training streams would hold a shutdown forever; past this they are cut
        # and the lifespan cancels their steps (clients retry after the restart).
        timeout_graceful_shutdown=5,
        ssl_certfile=str(config.ssl_certfile) if config.ssl_certfile else None,
        ssl_keyfile=str(config.ssl_keyfile) if config.ssl_keyfile else None,
    )
