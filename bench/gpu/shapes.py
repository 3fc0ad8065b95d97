"""Random-weight models of real architectures, for GPU benchmarks (no downloads there).

`make_model(folder, size, tokenizer_dir)` writes a Qwen3 model of the named shape with
random bf16 weights (`Qwen3Config` + `from_config`) and copies a tokenizer and chat
template beside it, so vLLM, TRL and our trainer load the same folder. Token ids are
random too; throughput does not depend on the weights' values. "tiny" is for rehearsing
the scripts on a CPU.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

SHAPES: dict[str, dict[str, int]] = {
    "tiny": dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=49152,
    ),
    "0.6b": dict(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
    ),
    "4b": dict(
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
    ),
    "8b": dict(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
    ),
    "14b": dict(
        hidden_size=5120,
        intermediate_size=17408,
        num_hidden_layers=40,
        num_attention_heads=40,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
    ),
    "32b": dict(
        hidden_size=5120,
        intermediate_size=25600,
        num_hidden_layers=64,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
    ),
}
"""Qwen3-0.6B/4B/8B/14B/32B shapes (hidden, layers, heads as published); 8B and larger
untie the embeddings (`TIED`)."""

TIED = {"tiny", "0.6b", "4b"}
"""Shapes whose output projection shares the embedding matrix."""

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "generation_config.json",
)
"""Copied beside the weights. The bench reuses the bundled SmolLM2 tokenizer: its 49,152
ids all exist in a 151,936-row vocabulary, which is all a random-weight model needs."""


def make_model(
    folder: str | Path, size: str, tokenizer_dir: str | Path | None, max_len: int = 32768
) -> dict[str, float]:
    """Write the model once (skipped when `folder` already holds it); return its stats."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    folder = Path(folder)
    stats_file = folder / "bench-model.json"
    if stats_file.exists():
        return json.loads(stats_file.read_text())
    started = time.perf_counter()
    config = Qwen3Config(
        max_position_embeddings=max_len,
        tie_word_embeddings=size in TIED,
        torch_dtype="bfloat16",
        **SHAPES[size],
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    for parameter in model.parameters():
        torch.nn.init.normal_(parameter, std=0.02)
    model.save_pretrained(folder)
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            source = Path(tokenizer_dir) / name
            if source.exists():
                shutil.copy(source, folder / name)
    stats = {
        "params": sum(p.numel() for p in model.parameters()),
        "make_s": round(time.perf_counter() - started, 1),
    }
    stats_file.write_text(json.dumps(stats))
    return stats


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="write a random-weight model folder")
    parser.add_argument("folder")
    parser.add_argument("size", choices=sorted(SHAPES))
    parser.add_argument("--tokenizer", default=None, help="folder to copy the tokenizer from")
    args = parser.parse_args()
    print(json.dumps(make_model(args.folder, args.size, args.tokenizer)))
