"""`LocalBackend` keeps at most `max_trainers` trainers in memory, least recently used out.

The trainer class is replaced by a light stand-in (the seam: a real trainer holds a copy of
the base model, and this checks only the cache policy); `load` records what a re-made
trainer resumes from."""

from typing import ClassVar

import pytest

import rlcoach.trainer.lora as lora
from rlcoach import LocalBackend, TrainableModel
from rlcoach.errors import ConfigError


class StandIn:
    """Records what the cache does with a trainer; `Trainer`'s other methods are unused."""

    made: ClassVar[list[int]] = []

    def __init__(self, model_path, config, device=None):
        self.loaded = None
        self.closed = False
        StandIn.made.append(config.seed)

    def load(self, folder):
        self.loaded = folder

    def close(self):
        self.closed = True


def test_least_recently_used_trainer_is_released_and_remade_from_its_checkpoint(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(lora, "LoraTrainer", StandIn)
    StandIn.made = []
    backend = LocalBackend(tmp_path, max_trainers=2)
    backend._model_path = tmp_path
    models = [TrainableModel(f"m{i}", "p", config={"seed": i}) for i in range(3)]
    first = backend._trainer(models[0])
    second = backend._trainer(models[1])
    assert backend._trainer(models[0]) is first  # used again: now the most recent
    backend._trainer(models[2])  # releases m1, the least recently used
    assert list(backend._trainers) == ["m0", "m2"] and second.closed and not first.closed
    checkpoint = backend.paths(models[1]).checkpoint(3)
    checkpoint.mkdir(parents=True)
    (checkpoint / "adapter_config.json").write_text("{}")
    remade = backend._trainer(models[1])
    assert remade.loaded == checkpoint and StandIn.made == [0, 1, 2, 1]
    assert list(backend._trainers) == ["m2", "m1"]
    first.closed = True  # e.g. its ranks died: the next use makes a new one
    assert backend._trainer(models[0]) is not first and StandIn.made == [0, 1, 2, 1, 0]


def test_max_trainers_below_one_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="max_trainers=0"):
        LocalBackend(tmp_path, max_trainers=0)


def test_a_trainer_in_use_is_never_closed_for_another_model():
    """The pool's leases (trainer/pool.py), the stand-in again for a trainer."""
    from rlcoach.errors import TrainerError
    from rlcoach.trainer.pool import TrainerPool

    pool = TrainerPool(1, wait_timeout_s=0.2)
    config = TrainableModel("m", "p").config
    first = pool.acquire("a", lambda: StandIn(None, config))
    with pytest.raises(TrainerError, match="max_trainers"):
        pool.acquire("b", lambda: StandIn(None, config))  # "a" is in use: b waits, then not
    assert not first.closed and pool.names() == ["a"]
    pool.release("a", first)
    second = pool.acquire("b", lambda: StandIn(None, config))  # "a" is idle: closed for "b"
    assert first.closed and pool.names() == ["b"]
    again = pool.acquire("b", lambda: StandIn(None, config))
    assert again is second  # a second lease of the same trainer
    pool.release("b", second, discard=True)  # failed past its update: forgotten at once
    assert pool.names() == [] and not second.closed  # the other lease still holds it
    pool.release("b", again)
    assert second.closed
