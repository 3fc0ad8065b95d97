"""A tiny random-weight Llama with a real tokenizer: a model folder that loads, generates
and trains in about a second.

Hidden size 32, two layers, tied embeddings, seeded (the same weights every time), with
the tokenizer and chat template of another model folder (the bundled one). Used by
`bench/soak_serve.py` and by the tests' `tiny_model_path` fixture (tests/conftest.py);
it lives in bench/ because bench/ must not import tests/, and pytest finds it through
`pythonpath`.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["save_tiny_model"]


def save_tiny_model(folder: Path, tokenizer_source: Path) -> Path:
    """Write the tiny Llama (weights, config, `tokenizer_source`'s tokenizer) into
    `folder` and return it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
