"""Dataset iteration: seeded epochs, and resuming yields the batches a full run would."""

import pytest

from rlcoach import ConfigError, iterate_dataset


def test_epochs_cover_every_item_once():
    batches = list(iterate_dataset(list(range(10)), batch_size=4, epochs=2, seed=1))
    assert [b.step for b in batches] == list(range(6))
    for epoch in (0, 1):
        items = [i for b in batches if b.epoch == epoch for i in b.items]
        assert sorted(items) == list(range(10))
    assert batches[0].items != batches[3].items  # each epoch has its own shuffle


def test_resume_matches_uninterrupted_run():
    full = list(iterate_dataset("abcdefgh", batch_size=3, epochs=3, seed=7))
    resumed = list(iterate_dataset("abcdefgh", batch_size=3, epochs=3, seed=7, initial_step=4))
    assert resumed == full[4:]


def test_bad_arguments():
    with pytest.raises(ConfigError, match="empty"):
        next(iterate_dataset([], batch_size=1))
    with pytest.raises(ConfigError, match="batch_size=0"):
        next(iterate_dataset([1], batch_size=0))
