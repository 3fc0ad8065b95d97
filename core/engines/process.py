"""An inference engine in a process of its own: started, watched, killed and started again.

vLLM runs this way, and so can the transformers engine (`transformers_process.py`). The
engine is an HTTP server speaking vLLM's API (`/health`, `/v1/chat/completions`, streamed
or not, `/v1/completions` for prompt log-probs, `/detokenize`, `/v1/load_lora_adapter`,
`/v1/unload_lora_adapter`); this class starts it, talks to it and answers the
supervisor's `exit_code()` and `restart()` (supervisor.py).

Choices, and why:
- The server listens on a Unix socket in a folder that only this user may enter (made by
  `mkdtemp`, mode 0700), not on a TCP port: nothing else on the machine can bind the
  address first (a free port found, released and then bound by the child can be taken in
  between), and no other user can connect to it.
- Each start gets a new random key, passed in the child's environment (never on its
  command line, which every user can read in /proc) and sent as a Bearer token: a process
  of the same user that finds the socket still cannot swap the served adapter.
- Children get this process's environment minus rlcoach's own secrets
  (`child_environment`): the engine has no use for the server's API key.
- The child gets SIGKILL when the thread that spawned it dies, and a watchdog kills its
  whole process group when this process dies (`rlcoach.runtime.processes`), so a `kill -9` of
  `rlcoach serve` leaves no engine behind.
- A start that times out kills what it started but keeps the client, so the supervisor's
  next `restart()` can succeed.
- The client is `EngineHTTP` (http.py: aiohttp where installed), and `chat_bytes` hands
  the gateway the engine's answer as bytes: every rollout's call crosses this hop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rlcoach.config import EngineConfig
from rlcoach.engines import fastjson
from rlcoach.engines.base import EngineHTTPError
from rlcoach.engines.http import (
    EngineConnectionError,
    EngineHTTP,
    EngineResponse,
    EngineStatusError,
)
from rlcoach.errors import ConfigError, EngineError, EngineStartError
from rlcoach.runtime.processes import kill_group, log_tail, parent_death_signal, watch_group

__all__ = ["SECRET_VARIABLES", "EngineProcess", "child_environment"]

logger = logging.getLogger(__name__)

SECRET_VARIABLES = ("RLCOACH_API_KEY",)
"""Environment variables no child process of rlcoach inherits."""


def child_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without rlcoach's secrets, with `extra` on top."""
    env = {k: v for k, v in os.environ.items() if k not in SECRET_VARIABLES}
    env.update(extra or {})
    return env


def _error_body(response: Any) -> dict[str, Any]:
    """The engine's refusal as an OpenAI-shaped body, whatever it sent (vLLM answers some
    errors as plain text or as `{"error": "Unauthorized"}`). `response` is an
    `EngineResponse` (or anything with its `status_code`, `json()`, `text` and
    `reason_phrase`)."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return data
    message = data.get("error") if isinstance(data, dict) else None
    text = str(message) if message else response.text[:500] or response.reason_phrase
    kind = "invalid_request_error" if response.status_code < 500 else "server_error"
    return {"error": {"message": f"the engine said: {text}", "type": kind, "param": None}}


class EngineProcess:
    """Start, watch and talk to an engine server in a process of its own.

    A subclass gives `command(socket_path)` (the server's command line) and may add to
    `environment()`; `KEY_VARIABLE` names the variable the server reads its key from.
    """

    KEY_VARIABLE = "VLLM_API_KEY"
    NAME = "engine"

    def __init__(self, base_name: str, config: EngineConfig, log_file: str | Path) -> None:
        self.base_name = base_name
        self.config = config
        self.log_file = Path(log_file)
        self._folder = Path(tempfile.mkdtemp(prefix="rlcoach-engine-"))  # mode 0700
        self.socket_path = self._folder / "engine.sock"
        self.url = f"unix:{self.socket_path}"
        self._key = ""
        self._process: subprocess.Popen[bytes] | None = None
        self._reaper: subprocess.Popen[bytes] | None = None
        self._client: EngineHTTP | None = None

    # -- for subclasses ------------------------------------------------------------------

    def command(self, socket_path: Path) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """The child's environment (secrets removed, its key added)."""
        return child_environment({self.KEY_VARIABLE: self._key})

    # -- the process ---------------------------------------------------------------------

    async def start(self) -> None:
        await self._launch()

    @property
    def pid(self) -> int | None:
        """The server process's id (its process group has the same id)."""
        return self._process.pid if self._process is not None else None

    def exit_code(self) -> int | None:
        """The exit code if the server process has died, else None."""
        return self._process.poll() if self._process is not None else None

    async def restart(self) -> None:
        """Start a fresh server after a crash (no adapter loaded)."""
        await self._stop_process(signal.SIGKILL)  # EngineCore and workers left by the crash
        await self._launch()

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            return subprocess.Popen(
                self.command(self.socket_path),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,
                preexec_fn=parent_death_signal(),
            )

    def _new_client(self) -> None:
        """A client for this start's socket and key (the old one, if any, is dropped)."""
        old, self._client = self._client, None
        if old is not None:
            # Closing waits for nothing here: its connections went with the old process.
            task = asyncio.get_running_loop().create_task(old.aclose())
            task.add_done_callback(lambda t: t.exception())
        # Idle connections are dropped well before the server's 5 s keep-alive closes
        # them: reusing one the server closes at that moment fails the request.
        self._client = EngineHTTP(
            "http://engine",
            uds=str(self.socket_path),
            headers={"Authorization": f"Bearer {self._key}"},
            timeout_s=self.config.request_timeout_s,
            keepalive_s=2.0,
        )

    async def _launch(self) -> None:
        logger.info("starting the %s on %s (log: %s)", self.NAME, self.url, self.log_file)
        started = time.monotonic()
        self._key = secrets.token_urlsafe(32)
        self._folder.mkdir(mode=0o700, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)  # the dead server's socket file
        self._new_client()
        # Spawned on this (long-lived) loop thread: the child's parent-death signal fires
        # when the spawning thread exits, and a worker thread of to_thread may exit early.
        self._process = self._spawn()
        self._reaper = watch_group(self._process)
        deadline = started + self.config.startup_timeout_s
        while time.monotonic() < deadline:
            code = self._process.poll()
            if code is not None:
                raise EngineStartError(
                    f"the {self.NAME} exited with code {code} while starting; its log "
                    f"{self.log_file} ends with:\n{log_tail(self.log_file)}"
                )
            if await self.healthy():
                logger.info("the %s is up after %.0f s", self.NAME, time.monotonic() - started)
                return
            await asyncio.sleep(0.5)
        # Kill what started but keep the client: the supervisor's restart can succeed.
        await self._stop_process(signal.SIGKILL)
        raise EngineStartError(
            f"the {self.NAME} did not answer within {self.config.startup_timeout_s:.0f} s "
            f"(EngineConfig.startup_timeout_s); see {self.log_file}:\n{log_tail(self.log_file)}"
        )

    async def _stop_process(self, signum: int) -> None:
        """Stop the server's whole process group and its watchdog."""
        process = self._process
        if process is not None and process.poll() is None:
            kill_group(process, signum)
            try:
                await asyncio.to_thread(process.wait, 30)
            except subprocess.TimeoutExpired:
                kill_group(process, signal.SIGKILL)
                await asyncio.to_thread(process.wait)
        # The server may be gone (a crash) while its children are not.
        kill_group(process, signal.SIGKILL)
        reaper, self._reaper = self._reaper, None
        if reaper is not None and reaper.poll() is None:
            reaper.terminate()  # it kills the (already stopped) group and exits
            await asyncio.to_thread(reaper.wait)

    # -- HTTP ----------------------------------------------------------------------------

    def _alive(self) -> None:
        if self._process is None or self._client is None:
            raise EngineError(f"the {self.NAME} is not started; call start() first")
        code = self._process.poll()
        if code is not None:
            raise EngineError(
                f"the {self.NAME} died (exit code {code}); its log {self.log_file} ends "
                f"with:\n{log_tail(self.log_file)}"
            )

    async def healthy(self) -> bool:
        if self._client is None:
            return False
        try:
            response = await self._client.request("GET", "/health", timeout_s=5.0)
        except EngineConnectionError:
            return False
        return response.status_code == 200

    async def _post(
        self, path: str, payload: dict[str, Any] | None = None, **options: Any
    ) -> EngineResponse:
        self._alive()
        assert self._client is not None
        try:
            return await self._client.request("POST", path, json=payload, **options)
        except EngineConnectionError as e:
            self._alive()  # a crash explains the failure better than the socket error
            raise EngineError(f"the {self.NAME} did not answer {path}: {e!r}") from e

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._chat_object(await self.chat_bytes(body))

    async def chat_bytes(self, body: dict[str, Any]) -> bytes:
        """The answer as the engine's JSON bytes (the gateway passes them on unparsed)."""
        response = await self._post("/v1/chat/completions", body)
        if response.status_code != 200:
            raise EngineHTTPError(response.status_code, _error_body(response))
        return response.content

    def _chat_object(self, raw: bytes) -> dict[str, Any]:
        try:
            data = fastjson.loads(raw)
        except ValueError as e:
            raise EngineError(
                f"the {self.NAME} answered a chat completion with a body that is not JSON: "
                f"{raw[:200]!r}"
            ) from e
        if not isinstance(data, dict):
            raise EngineError(f"the {self.NAME} answered a chat completion with {data!r:.200}")
        return data

    async def chat_stream(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        self._alive()
        assert self._client is not None
        try:
            async for line in self._client.lines("POST", "/v1/chat/completions", json=body):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                if data:
                    yield fastjson.loads(data)
        except EngineStatusError as e:
            raise EngineHTTPError(e.response.status_code, _error_body(e.response)) from None
        except EngineConnectionError as e:
            self._alive()
            raise EngineError(f"the {self.NAME} broke off a streamed chat: {e!r}") from e

    async def token_logprobs(self, model: str, token_ids: list[int], start: int) -> list[float]:
        # Prompt log-probs are computed from the raw logits: no grammar, no temperature.
        payload = {
            "model": model,
            "prompt": token_ids,
            "max_tokens": 1,
            "prompt_logprobs": 0,
            "temperature": 0.0,
        }
        response = await self._post("/v1/completions", payload)
        if response.status_code != 200:
            raise EngineHTTPError(response.status_code, _error_body(response))
        positions = response.json()["choices"][0]["prompt_logprobs"]
        values = []
        for token, entry in zip(token_ids[start:], positions[start:], strict=True):
            values.append(float(entry[str(token)]["logprob"]))
        return values

    async def prompt_length(self, model: str, body: dict[str, Any]) -> int:
        """The tokens of a chat request's prompt, as the engine renders it (tools too)."""
        payload = {"model": model, "messages": body.get("messages") or []}
        if body.get("tools"):
            payload["tools"] = body["tools"]
        response = await self._post("/tokenize", payload)
        if response.status_code != 200:
            raise EngineHTTPError(response.status_code, _error_body(response))
        return int(response.json()["count"])

    async def detokenize(self, model: str, token_ids: list[int]) -> str:
        response = await self._post("/detokenize", {"model": model, "tokens": token_ids})
        if response.status_code != 200:
            raise EngineHTTPError(response.status_code, _error_body(response))
        return str(response.json()["prompt"])

    async def load_adapter(self, served_name: str, path: Path) -> None:
        payload = {"lora_name": served_name, "lora_path": str(path)}  # absolute: see LocalBackend
        response = await self._post("/v1/load_lora_adapter", payload)
        if response.status_code == 200:
            return
        message = _error_body(response)["error"]["message"]
        text = f"the {self.NAME} refused adapter {served_name!r} at {path}: {message}"
        if response.status_code < 500:  # a refusal of what was sent: the same again fails
            raise ConfigError(
                text + "; fix: train with a LoRA the engine accepts (EngineConfig."
                "max_lora_rank bounds the rank, the engine's log says more)"
            )
        raise EngineError(text)

    async def unload_adapter(self, served_name: str) -> None:
        response = await self._post("/v1/unload_lora_adapter", {"lora_name": served_name})
        if response.status_code not in (200, 404):
            message = _error_body(response)["error"]["message"]
            raise EngineError(f"the {self.NAME} could not unload {served_name!r}: {message}")

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        await self._stop_process(signal.SIGTERM)
        self._process = None
        shutil.rmtree(self._folder, ignore_errors=True)
