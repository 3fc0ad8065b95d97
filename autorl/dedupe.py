"""Duplicate removal: exact (after normalisation) and near duplicates.

Generators repeat themselves, small ones especially, and a training set with the same
question five times over trains five times on it and leaks it into the held-out split.
Two records are duplicates when their normalised texts (lower case, punctuation dropped,
whitespace collapsed) are equal, or near duplicates when the Jaccard similarity of their
word 3-gram shingles (character shingles for very short texts) is at least `threshold`.
When an `embed` function is given (texts -> unit vectors, e.g. a sentence-embedding
model available offline), cosine similarity of at least `embedding_threshold` also counts.
The first record of each cluster is kept, so the result is a pure function of the order.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence

from rlcoach.autorl.types import InputRecord

__all__ = ["Embed", "deduplicate", "normalize_text", "shingles"]

Embed = Callable[[list[str]], list[list[float]]]
"""Texts to unit-length embedding vectors."""


def normalize_text(text: str) -> str:
    """Lower case, accents and punctuation dropped, whitespace collapsed."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c)).lower()
    text = re.sub(r"[^\w\s]", " ", text)
    return " ".join(text.split())


def shingles(text: str) -> frozenset[str]:
    """Word 3-grams of the normalised text (character 4-grams below four words)."""
    normal = normalize_text(text)
    words = normal.split()
    if len(words) >= 4:
        return frozenset(" ".join(words[i : i + 3]) for i in range(len(words) - 2))
    return frozenset(normal[i : i + 4] for i in range(max(len(normal) - 3, 1)))


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def deduplicate(
    records: Sequence[InputRecord],
    *,
    threshold: float = 0.7,
    embed: Embed | None = None,
    embedding_threshold: float = 0.9,
    against: Sequence[InputRecord] = (),
) -> tuple[list[InputRecord], list[InputRecord]]:
    """(kept, removed): the first of each group of (near) duplicates is kept.

    Records in `against` (e.g. those generated earlier) are never returned but count as
    seen, so nothing that duplicates them is kept.
    """
    seen_text: set[str] = {normalize_text(r.text) for r in against}
    seen_shingles: list[frozenset[str]] = [shingles(r.text) for r in against]
    vectors: list[list[float]] = embed([r.text for r in against]) if embed and against else []
    new_vectors = embed([r.text for r in records]) if embed and records else []
    kept: list[InputRecord] = []
    removed: list[InputRecord] = []
    for position, record in enumerate(records):
        normal = normalize_text(record.text)
        grams = shingles(record.text)
        duplicate = normal in seen_text or any(
            _jaccard(grams, s) >= threshold for s in seen_shingles
        )
        if not duplicate and embed is not None:
            vector = new_vectors[position]
            duplicate = any(
                sum(x * y for x, y in zip(vector, other, strict=True)) >= embedding_threshold
                for other in vectors
            )
        if duplicate:
            removed.append(record)
            continue
        kept.append(record)
        seen_text.add(normal)
        seen_shingles.append(grams)
        if embed is not None:
            vectors.append(new_vectors[position])
    return kept, removed
