"""A deterministic train/eval split, saved as JSONL so a run can be reproduced.

Each record goes to the eval split when the hash of (seed, its id) falls below
`eval_fraction`, so the split of a record never depends on which other records exist or
in what order they came: regenerating more inputs never moves an eval record into
training. `save_dataset` writes `train.jsonl`, `eval.jsonl` and `dataset.json` (the task,
the system prompt when there is one, counts, the generator and its usage) atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlcoach.autorl.types import InputRecord
from rlcoach.errors import ConfigError, DataError
from rlcoach.paths import write_text_atomic

__all__ = ["load_records", "save_dataset", "split_by_share", "split_records"]


def _unit(seed: int, record_id: str) -> float:
    digest = hashlib.sha256(f"{seed}:{record_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_records(
    records: Sequence[InputRecord],
    eval_fraction: float = 0.2,
    seed: int = 0,
    key: Callable[[InputRecord], str] | None = None,
) -> tuple[list[InputRecord], list[InputRecord]]:
    """(train, eval), each in input order; a pure function of each record's id and seed.

    `key` groups records that must land on the same side (e.g. the call a grounded
    scenario was written from, so no held-out answer is trained on): its value is
    hashed instead of the id."""
    if not 0.0 <= eval_fraction < 1.0:
        raise ConfigError(
            f"eval_fraction={eval_fraction!r} must be in [0, 1); e.g. 0.2 keeps a fifth "
            "of the inputs for evaluation"
        )
    train, evaluation = [], []
    for record in records:
        unit = _unit(seed, key(record) if key is not None else record.id)
        (evaluation if unit < eval_fraction else train).append(record)
    return train, evaluation


def split_by_share(
    records: Sequence[InputRecord],
    eval_fraction: float,
    seed: int,
    key: Callable[[InputRecord], str],
) -> tuple[list[InputRecord], list[InputRecord]]:
    """(train, eval), each in input order, records of one `key` on the same side; the keys
    go to eval in a seeded order while that brings its share of the records nearer to
    `eval_fraction`, and at least one key stays on each side when there are two. Unlike
    `split_records` the eval side's size does not hang on how a few keys hash (with 15
    keys and a fraction of 0.25, hashing alone put 3 to 16 of 32 records in eval), at
    the price of depending on which records exist: for a set made once (a run's
    grounded scenarios), not for one that grows."""
    sizes: dict[str, int] = {}
    for record in records:
        sizes[key(record)] = sizes.get(key(record), 0) + 1
    target = eval_fraction * len(records)
    held: set[str] = set()
    count = 0
    for name in sorted(sizes, key=lambda name: _unit(seed, name)):
        if len(held) == len(sizes) - 1 or (
            held and abs(count + sizes[name] - target) >= abs(count - target)
        ):
            break
        held.add(name)
        count += sizes[name]
    train = [r for r in records if key(r) not in held]
    return train, [r for r in records if key(r) in held]


def _jsonl(records: Sequence[InputRecord]) -> str:
    return "".join(record.model_dump_json() + "\n" for record in records)


def save_dataset(
    folder: str | os.PathLike[str],
    train: Sequence[InputRecord],
    evaluation: Sequence[InputRecord],
    manifest: dict[str, Any],
) -> Path:
    """Write `train.jsonl`, `eval.jsonl` and `dataset.json` under `folder`."""
    target = Path(folder)
    write_text_atomic(target / "train.jsonl", _jsonl(train))
    write_text_atomic(target / "eval.jsonl", _jsonl(evaluation))
    body = {**manifest, "train": len(train), "eval": len(evaluation)}
    write_text_atomic(target / "dataset.json", json.dumps(body, indent=2, sort_keys=True))
    return target


def load_records(path: str | os.PathLike[str]) -> list[InputRecord]:
    """Read a JSONL file written by `save_dataset`."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    records.append(InputRecord.model_validate_json(line))
                except ValueError as e:
                    raise DataError(
                        f"{path}:{number} is not an input record ({e}); fix: write the file "
                        "with save_dataset, one InputRecord as JSON per line"
                    ) from e
    return records
