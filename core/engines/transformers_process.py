"""The transformers engine in a process of its own, speaking vLLM's HTTP API.

`EngineConfig(kind="transformers-process")` (`rlcoach serve --engine transformers-process`)
runs `TransformersEngine` behind a small server that answers the routes rlcoach uses of
vLLM's (`/health`, `/v1/chat/completions`, `/v1/completions` for prompt log-probs,
`/detokenize`, `/v1/load_lora_adapter`, `/v1/unload_lora_adapter`), on a private Unix
socket with a key, started and supervised by `EngineProcess` exactly as vLLM is. It
starts in seconds where vLLM takes a minute, so the engine's faults — killed mid-rollout
or mid-publish, restarted, its adapters reloaded — are tested and soaked on real
processes without a vLLM start; and generation stays off the serving process's CPU
threads.

Like vLLM, it refuses an adapter whose rank is above `--max-lora-rank` (400).

    python -m rlcoach.engines.transformers_process --model DIR --served-model-name NAME \
        --uds PATH [--max-model-len N] [--max-lora-rank R] [--dtype D] [--chat-template F]

The key comes from `$RLCOACH_ENGINE_KEY`, never from the command line.
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rlcoach.config import EngineConfig
from rlcoach.engines.base import EngineHTTPError
from rlcoach.engines.process import EngineProcess
from rlcoach.models.families import fallback_chat_template
from rlcoach.paths import write_text_atomic
from rlcoach.runtime.failpoints import failpoint

__all__ = ["TransformersProcessEngine", "main"]

logger = logging.getLogger(__name__)

KEY_VARIABLE = "RLCOACH_ENGINE_KEY"


class TransformersProcessEngine(EngineProcess):
    """The client half: starts `python -m rlcoach.engines.transformers_process`."""

    KEY_VARIABLE = KEY_VARIABLE
    NAME = "transformers engine process"

    def __init__(
        self, model_path: str | Path, base_name: str, config: EngineConfig, log_file: str | Path
    ) -> None:
        super().__init__(base_name, config, log_file)
        self.model_path = Path(model_path)

    def command(self, socket_path: Path) -> list[str]:
        c = self.config
        args = [
            sys.executable,
            "-m",
            "rlcoach.engines.transformers_process",
            "--model",
            str(self.model_path),
            "--served-model-name",
            self.base_name,
            "--uds",
            str(socket_path),
            "--max-model-len",
            str(c.max_model_len),
            "--max-lora-rank",
            str(c.max_lora_rank),
            "--dtype",
            c.dtype,
        ]
        if c.chat_template is not None:
            args += ["--chat-template", str(c.chat_template)]
        elif (fallback := fallback_chat_template(self.model_path)) is not None:
            file = self.base_name.replace("/", "--")  # a hub id names no subfolder
            template = self.log_file.with_name(f"{file}-chat-template.jinja")
            write_text_atomic(template, fallback)
            args += ["--chat-template", str(template)]
        return args


async def _sse(events: list[dict[str, Any]]) -> Any:
    for event in events:
        yield b"data: " + json.dumps(event).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


class _VLLMRoutes:
    """The server half: vLLM's routes over a `TransformersEngine`."""

    def __init__(self, engine: Any, key: str, max_lora_rank: int) -> None:
        self.engine = engine
        self.key = key
        self.max_lora_rank = max_lora_rank

    @staticmethod
    def error(status: int, message: str) -> JSONResponse:
        kind = "invalid_request_error" if status < 500 else "server_error"
        body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
        return JSONResponse(body, status_code=status)

    def authorized(self, request: Request) -> bool:
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self.key}".encode())

    @staticmethod
    async def body_of(request: Request) -> dict[str, Any] | None:
        try:
            body = json.loads(await request.body())
        except (ValueError, RecursionError):
            return None
        return body if isinstance(body, dict) else None

    async def health(self, request: Request) -> Response:
        if await self.engine.healthy():
            return JSONResponse({"status": "ok"})
        return self.error(503, "the model is not loaded")

    async def chat(self, request: Request) -> Response:
        if not self.authorized(request):
            return self.error(401, "Unauthorized")
        body = await self.body_of(request)
        if body is None:
            return self.error(400, "the body is not a JSON object")
        try:
            if body.get("stream"):
                events = [event async for event in self.engine.chat_stream(body)]
                return StreamingResponse(_sse(events), media_type="text/event-stream")
            return JSONResponse(await self.engine.chat(body))
        except EngineHTTPError as e:
            return JSONResponse(e.body, status_code=e.status)
        except (TypeError, ValueError, KeyError) as e:
            return self.error(400, f"bad request: {e!r}")

    async def completions(self, request: Request) -> Response:
        # Only what the policy endpoint asks of it: the prompt log-probs of token ids.
        if not self.authorized(request):
            return self.error(401, "Unauthorized")
        body = await self.body_of(request)
        prompt = (body or {}).get("prompt")
        if (
            body is None
            or body.get("prompt_logprobs") is None
            or not isinstance(prompt, list)
            or not prompt
            or not all(isinstance(t, int) for t in prompt)
        ):
            return self.error(400, "only `prompt` as token ids with `prompt_logprobs` is served")
        try:
            values = await self.engine.token_logprobs(str(body.get("model")), prompt, 0)
        except (TypeError, ValueError, KeyError) as e:
            return self.error(400, f"bad request: {e!r}")
        positions = [None] + [
            {str(token): {"logprob": value, "rank": None}}
            for token, value in zip(prompt[1:], values[1:], strict=True)
        ]
        return JSONResponse({"choices": [{"index": 0, "prompt_logprobs": positions}]})

    async def detokenize(self, request: Request) -> Response:
        if not self.authorized(request):
            return self.error(401, "Unauthorized")
        body = await self.body_of(request)
        tokens = (body or {}).get("tokens")
        if (
            body is None
            or not isinstance(tokens, list)
            or not all(isinstance(t, int) for t in tokens)
        ):
            return self.error(400, "`tokens` must be a list of token ids")
        return JSONResponse(
            {"prompt": await self.engine.detokenize(str(body.get("model")), tokens)}
        )

    async def load(self, request: Request) -> Response:
        if not self.authorized(request):
            return self.error(401, "Unauthorized")
        body = await self.body_of(request)
        if body is None or not body.get("lora_name") or not body.get("lora_path"):
            return self.error(400, "`lora_name` and `lora_path` are required")
        path = Path(str(body["lora_path"]))
        try:
            rank = int(json.loads((path / "adapter_config.json").read_text())["r"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            return self.error(400, f"no loadable adapter at {path}: {e!r}")
        if rank > self.max_lora_rank:
            return self.error(
                400, f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}"
            )
        try:
            failpoint("engine.load_adapter")  # the fault tests' refusal or crash here
            await self.engine.load_adapter(str(body["lora_name"]), path)
        except Exception as e:  # peft's errors for a bad folder are of many kinds
            return self.error(400, f"loading adapter {body['lora_name']!r} failed: {e!r}")
        return Response("Success: LoRA adapter loaded", status_code=200)

    async def unload(self, request: Request) -> Response:
        if not self.authorized(request):
            return self.error(401, "Unauthorized")
        body = await self.body_of(request)
        if body is None or not body.get("lora_name"):
            return self.error(400, "`lora_name` is required")
        await self.engine.unload_adapter(str(body["lora_name"]))
        return Response("Success: LoRA adapter unloaded", status_code=200)

    def app(self) -> Starlette:
        """The ASGI app serving these routes."""
        return Starlette(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/detokenize", self.detokenize, methods=["POST"]),
                Route("/v1/load_lora_adapter", self.load, methods=["POST"]),
                Route("/v1/unload_lora_adapter", self.unload, methods=["POST"]),
            ]
        )


def main(argv: list[str] | None = None) -> None:
    import asyncio

    import uvicorn

    from rlcoach.engines.transformers import TransformersEngine

    parser = argparse.ArgumentParser(description="the transformers engine behind vLLM's API")
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--uds", required=True)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--max-lora-rank", type=int, default=16)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--chat-template", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    key = os.environ.pop(KEY_VARIABLE, "")
    if not key:
        parser.error(f"${KEY_VARIABLE} is not set: the engine refuses to run without a key")
    template = Path(args.chat_template).read_text() if args.chat_template else None
    engine = TransformersEngine(
        args.model,
        args.served_model_name,
        max_model_len=args.max_model_len,
        chat_template=template,
        dtype=args.dtype,
    )
    asyncio.run(engine.start())
    uvicorn.run(
        _VLLMRoutes(engine, key, args.max_lora_rank).app(),
        uds=args.uds,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=5,
    )


if __name__ == "__main__":
    main()
