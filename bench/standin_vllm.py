"""A stand-in for vLLM's OpenAI server: instant answers on the routes rlcoach uses.

It runs as its own process and speaks the HTTP of `python -m vllm.entrypoints.openai.
api_server` as far as the policy endpoint needs it: `GET /health`, `GET /v1/models`,
`POST /v1/chat/completions` (with `logprobs.content`, `token_ids` and
`prompt_token_ids`, as vLLM returns them when asked for logprobs and token ids),
`POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`, and sleep mode (`POST
/sleep?level=1`, `POST /wake_up`, `GET /is_sleeping`, only with `--enable-sleep-mode`
and `VLLM_SERVER_DEV_MODE=1`, as in vLLM). It accepts vLLM's command-line arguments and
ignores the ones it has no use for.

Two users:
- bench/gateway_overhead.py: a fast upstream (a precomputed body per completion length,
  answered without any model), so what is measured is the gateway's own cost;
- the colocation tests: vLLM's sleep mode needs a CUDA GPU, so on the CPU the sleep and
  wake path is exercised against this server (the one seam; `GET /events` lists what it
  saw, and a chat that arrives while it sleeps is answered 503 and logged as such).

Completions are `--completion-tokens` tokens long, or `max_tokens` if smaller; token ids
are drawn from `--vocab` deterministically, each with log-prob -1.0.

Like vLLM it listens on `--uds` (a Unix socket, as rlcoach starts engines) or
`--host`/`--port`, and, where `VLLM_API_KEY` is set, answers a `/v1` request without
`Authorization: Bearer <key>` with 401.

  python bench/standin_vllm.py --port 8001 --served-model-name base [--enable-sleep-mode]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from typing import Any

try:  # a fast path where vLLM's own dependencies are installed
    import orjson

    def dumps(value: Any) -> bytes:
        return orjson.dumps(value)

except ImportError:

    def dumps(value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode()


class StandIn:
    """The ASGI app (no framework: it should cost as little as possible)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.base = args.served_model_name
        self.adapters: dict[str, str] = {}
        self.sleep_mode = args.enable_sleep_mode and os.environ.get("VLLM_SERVER_DEV_MODE") == "1"
        self.sleeping = False
        self.events: list[dict[str, Any]] = []
        self._bodies: dict[tuple[str, int], bytes] = {}
        self.random = random.Random(0)
        self._served = 0
        key = os.environ.get("VLLM_API_KEY")
        self.authorization = f"Bearer {key}".encode() if key else None

    def completion(self, model: str, tokens: int, prompt_tokens: int) -> bytes:
        """The response body for `tokens` sampled tokens (cached per model and length)."""
        key = (model, tokens)
        if key not in self._bodies:
            vocab = self.args.vocab
            ids = [(7919 * i + 13) % (vocab - 200) + 100 for i in range(tokens)]
            content = [
                {
                    "token": f"t{t}",
                    "logprob": -1.0,
                    "bytes": list(f"t{t}".encode()),
                    "top_logprobs": [],
                }
                for t in ids
            ]
            body = {
                "id": "chatcmpl-standin",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": " ".join(e["token"] for e in content),
                            "tool_calls": [],
                            "reasoning_content": None,
                        },
                        "logprobs": {"content": content},
                        "finish_reason": "length",
                        "stop_reason": None,
                        "token_ids": ids,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": tokens,
                    "total_tokens": prompt_tokens + tokens,
                },
                "prompt_token_ids": [
                    (31 * i + 7) % (vocab - 200) + 100 for i in range(prompt_tokens)
                ],
                "prompt_logprobs": None,
                "kv_transfer_params": None,
            }
            self._bodies[key] = dumps(body)
        return self._bodies[key]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if self.authorization is not None and scope["path"].startswith("/v1"):
            given = dict(scope["headers"]).get(b"authorization")
            if given != self.authorization:
                status, payload = 401, b'{"error":"Unauthorized"}'
            else:
                status, payload = await self.route(scope["method"], scope["path"], scope, body)
        else:
            status, payload = await self.route(scope["method"], scope["path"], scope, body)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    def note(self, kind: str, **data: Any) -> None:
        self.events.append({"event": kind, "time": time.time(), **data})

    async def route(
        self, method: str, path: str, scope: dict[str, Any], body: bytes
    ) -> tuple[int, bytes]:
        if path == "/v1/chat/completions" and method == "POST":
            request = json.loads(body)
            model = request.get("model")
            if self.sleeping:
                self.note("chat_while_asleep", model=model)
                return 503, dumps(
                    {"error": {"message": "the engine is asleep", "type": "server_error"}}
                )
            if model != self.base and model not in self.adapters:
                message = f"The model `{model}` does not exist."
                return 404, dumps(
                    {"error": {"message": message, "type": "NotFoundError", "code": 404}}
                )
            hold = float(request.get("standin_hold_s", self.args.delay_s))
            if hold > 0:  # a generation time, spread +-50% so completions do not arrive in waves
                await asyncio.sleep(hold * (0.5 + self.random.random()))
            tokens = min(
                int(request.get("max_tokens") or self.args.completion_tokens),
                self.args.completion_tokens,
            )
            prompt = (
                sum(len(str(m.get("content") or "")) for m in request.get("messages") or []) // 4
                + 8
            )
            self._served += 1
            if self.args.log_chats:
                self.note("chat", model=model)
            return 200, self.completion(model, tokens, min(prompt, 64))
        if path == "/health":
            return 200, b"{}"
        if path == "/v1/models":
            names = [self.base, *self.adapters]
            return 200, dumps(
                {"object": "list", "data": [{"id": n, "object": "model"} for n in names]}
            )
        if path == "/v1/load_lora_adapter" and method == "POST":
            request = json.loads(body)
            self.adapters[request["lora_name"]] = request["lora_path"]
            self.note("load", name=request["lora_name"], asleep=self.sleeping)
            return 200, b'"ok"'
        if path == "/v1/unload_lora_adapter" and method == "POST":
            request = json.loads(body)
            found = self.adapters.pop(request["lora_name"], None)
            return (200, b'"ok"') if found else (404, dumps({"error": {"message": "not loaded"}}))
        if path == "/events":
            return 200, dumps({"events": self.events, "served": self._served})
        if self.sleep_mode and path == "/sleep" and method == "POST":
            self.sleeping = True
            self.note("sleep", query=scope.get("query_string", b"").decode())
            return 200, dumps({"status": "sleeping", "level": 1})
        if self.sleep_mode and path == "/wake_up" and method == "POST":
            self.sleeping = False
            self.note("wake")
            return 200, dumps({"status": "awake", "tags": None})
        if self.sleep_mode and path == "/is_sleeping":
            return 200, dumps({"is_sleeping": self.sleeping})
        return 404, dumps({"detail": "Not Found"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--uds", help="listen on this Unix socket instead of --host/--port")
    parser.add_argument("--served-model-name", default="standin")
    parser.add_argument("--enable-sleep-mode", action="store_true")
    parser.add_argument("--completion-tokens", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument(
        "--delay-s",
        type=float,
        default=0.0,
        help="hold each chat about this long, +-50%% (a body's `standin_hold_s` overrides it)",
    )
    parser.add_argument("--log-chats", action="store_true", help="list each chat in /events")
    args, _ = parser.parse_known_args()  # vLLM's own arguments are accepted and ignored
    import uvicorn

    uvicorn.run(
        StandIn(args),
        host=args.host,
        port=args.port,
        uds=args.uds,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_keep_alive=30,
    )


if __name__ == "__main__":
    main()
