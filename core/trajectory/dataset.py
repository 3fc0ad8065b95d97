"""Dataset iteration with resumable epochs.

`iterate_dataset` yields one batch of items per training step. Each epoch is a seeded
shuffle of the whole dataset, so the sequence of batches is a pure function of
(items, batch size, seed): resuming at `initial_step` (a model's step after a restart)
yields exactly the batches an uninterrupted run would have yielded from there.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from rlcoach.errors import ConfigError

__all__ = ["DatasetBatch", "iterate_dataset"]

Item = TypeVar("Item")


@dataclass(frozen=True, slots=True)
class DatasetBatch(Generic[Item]):
    step: int
    """The training step this batch is for (0-based: the model's step before training)."""
    epoch: int
    items: list[Item]
    epoch_step: int = 0
    """The batch's position within its epoch."""


def iterate_dataset(
    items: Sequence[Item],
    batch_size: int | None = None,
    epochs: int = 1,
    *,
    seed: int = 0,
    initial_step: int = 0,
    shuffle: bool = True,
    groups_per_step: int | None = None,
    num_epochs: int | None = None,
    use_tqdm: bool = False,
) -> Iterator[DatasetBatch[Item]]:
    """Batches of `batch_size` items for `epochs` epochs, starting at `initial_step`.

    `groups_per_step` and `num_epochs` are ART's names for `batch_size` (default 1) and
    `epochs`; `use_tqdm` is accepted for ART's sake (the gathers show progress)."""
    if groups_per_step is not None:
        if batch_size is not None and batch_size != groups_per_step:
            raise ConfigError(
                f"batch_size={batch_size!r} and groups_per_step={groups_per_step!r} name the "
                "same number twice; fix: give one of them"
            )
        batch_size = groups_per_step
    batch_size = 1 if batch_size is None else batch_size
    epochs = epochs if num_epochs is None else num_epochs
    if not items:
        raise ConfigError("the dataset is empty; fix: pass at least one item")
    if batch_size < 1 or epochs < 1 or initial_step < 0:
        raise ConfigError(
            f"batch_size={batch_size!r} and epochs={epochs!r} must be at least 1, "
            f"initial_step={initial_step!r} at least 0"
        )
    per_epoch = -(-len(items) // batch_size)
    for step in range(initial_step, per_epoch * epochs):
        epoch, index = divmod(step, per_epoch)
        order = list(range(len(items)))
        if shuffle:
            random.Random(seed * 1_000_003 + epoch).shuffle(order)
        chosen = order[index * batch_size : (index + 1) * batch_size]
        yield DatasetBatch(
            step=step, epoch=epoch, items=[items[i] for i in chosen], epoch_step=index
        )
