"""Tiny random-weight Llamas: model folders that load, generate and train in a second.

One builder for every tiny model the tests and benchmarks use: two layers, tied
embeddings, seeded (the same weights every time), sized by the caller. Given a
`tokenizer_source` (the bundled model's folder), the model takes that tokenizer, its
vocabulary and special tokens, and the folder gets the tokenizer and chat template;
without one, the vocabulary is `vocab_size` token ids and there is no tokenizer (the
trainer tests feed token ids). Used by `bench/soak_serve.py` and by the tests' fixtures
(tests/conftest.py); it lives in bench/ because bench/ must not import tests/, and pytest
finds it through `pythonpath`.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["save_tiny_model"]


def save_tiny_model(
    folder: Path,
    tokenizer_source: Path | None = None,
    *,
    vocab_size: int = 256,
    hidden_size: int = 32,
    max_positions: int = 2048,
) -> Path:
    """Write a tiny Llama (weights, config, and `tokenizer_source`'s tokenizer if given)
    into `folder` and return it. Its MLP is twice `hidden_size`, its 4 heads share 2
    key-value heads."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    special: dict[str, int | None] = {}
    tokenizer = None
    if tokenizer_source is not None:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
        vocab_size = len(tokenizer)
        special = {
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        }
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        **special,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder
