"""The trainers a backend keeps in memory: one per model, at most `capacity`, leased.

Each trainer holds a copy of the base model, so `LocalBackend` keeps at most
`max_trainers` of them; the least recently used goes first when another model needs
one. A step holds its model's trainer for as long as it runs (`acquire` ... `release`):
a trainer in use is never closed for another model, which waits instead — at most
`wait_timeout_s`, then a retryable `TrainerError` (the other steps will end). Steps run
in worker threads, so the pool is thread-safe; making, loading and closing a trainer (a
model load, a torchrun start or stop: seconds to minutes) happen outside its lock.

A trainer that failed past its optimizer step is `release`d with `discard=True`: it is
forgotten at once (the next step of its model makes a new one from the latest complete
checkpoint, exactly where the model stands on disk) and closed once no step holds it.
A trainer whose ranks died (`closed`) is replaced the same way. This module imports no
torch: `make` builds the trainer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from rlcoach.errors import TrainerError
from rlcoach.trainer.base import Trainer

__all__ = ["TrainerPool"]

logger = logging.getLogger(__name__)


class TrainerPool:
    """At most `capacity` trainers, one per model name; those in use are never closed."""

    def __init__(self, capacity: int, wait_timeout_s: float = 3600.0) -> None:
        self.capacity = capacity
        self.wait_timeout_s = wait_timeout_s
        self._lock = threading.Condition()
        self._trainers: OrderedDict[str, Trainer] = OrderedDict()
        """Kept trainers by model name, least recently used first."""
        self._users: dict[int, int] = {}
        """Steps holding each trainer (by `id`), kept or discarded."""
        self._making: set[str] = set()
        """Names whose trainer is being made (they count against `capacity`)."""
        self._retired: dict[int, Trainer] = {}
        """Discarded trainers still held by a step: closed at their last release."""

    def names(self) -> list[str]:
        """The models with a trainer in memory, least recently used first."""
        with self._lock:
            return list(self._trainers)

    def peek(self, name: str) -> Trainer | None:
        """The kept trainer of `name`, if any (not leased: for tests and benchmarks)."""
        with self._lock:
            return self._trainers.get(name)

    def acquire(self, name: str, make: Callable[[], Trainer]) -> Trainer:
        """`name`'s trainer, made with `make` if none is kept; hold it until `release`."""
        deadline = time.monotonic() + self.wait_timeout_s
        to_close: list[Trainer] = []
        try:
            with self._lock:
                while True:
                    trainer = self._trainers.get(name)
                    if trainer is not None and trainer.closed:
                        logger.warning("the trainer of %s is closed; making a new one", name)
                        self._forget(name, trainer, to_close)
                        trainer = None
                    if trainer is not None:
                        self._trainers.move_to_end(name)
                        self._users[id(trainer)] = self._users.get(id(trainer), 0) + 1
                        return trainer
                    if name not in self._making:
                        if len(self._trainers) + len(self._making) < self.capacity:
                            self._making.add(name)
                            break
                        victim = next(
                            (n for n, t in self._trainers.items() if not self._users.get(id(t))),
                            None,
                        )
                        if victim is not None:
                            logger.info(
                                "released the trainer of %s (max_trainers=%d)",
                                victim,
                                self.capacity,
                            )
                            self._forget(victim, self._trainers[victim], to_close)
                            continue
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TrainerError(
                            f"no trainer for {name!r} within {self.wait_timeout_s:.0f} s: all "
                            f"{self.capacity} trainers kept in memory (max_trainers) were in "
                            f"use by other models' steps ({', '.join(self._trainers)}); fix: "
                            "retry once they finish, or give the backend a larger max_trainers"
                        )
                    self._lock.wait(remaining)
        finally:
            _close_all(to_close)
        try:
            trainer = make()
        except BaseException:
            with self._lock:
                self._making.discard(name)
                self._lock.notify_all()
            raise
        with self._lock:
            self._making.discard(name)
            self._trainers[name] = trainer
            self._users[id(trainer)] = 1
            self._lock.notify_all()
        return trainer

    def release(self, name: str, trainer: Trainer, *, discard: bool = False) -> None:
        """End a step's hold on `trainer`; `discard`: it failed past its optimizer step, so
        it is forgotten now and closed once no step holds it."""
        to_close: list[Trainer] = []
        with self._lock:
            users = self._users.get(id(trainer), 1) - 1
            if users:
                self._users[id(trainer)] = users
            else:
                self._users.pop(id(trainer), None)
            if discard and self._trainers.get(name) is trainer:
                logger.warning(
                    "dropped the trainer of %s: its step failed after changing it; the next "
                    "step resumes from the latest complete checkpoint",
                    name,
                )
                self._forget(name, trainer, to_close)
            elif not users and id(trainer) in self._retired:
                to_close.append(self._retired.pop(id(trainer)))
            self._lock.notify_all()
        _close_all(to_close)

    def forget(self, name: str) -> None:
        """Drop `name`'s kept trainer (its checkpoints changed on disk, e.g. a restore); the
        next step makes one from the latest checkpoint. Closed once no step holds it."""
        to_close: list[Trainer] = []
        with self._lock:
            trainer = self._trainers.get(name)
            if trainer is not None:
                self._forget(name, trainer, to_close)
            self._lock.notify_all()
        _close_all(to_close)

    def close(self) -> None:
        """Close every trainer (the backend is closing: no step runs any more)."""
        with self._lock:
            to_close = [*self._trainers.values(), *self._retired.values()]
            self._trainers.clear()
            self._retired.clear()
            self._users.clear()
        _close_all(to_close)

    def _forget(self, name: str, trainer: Trainer, to_close: list[Trainer]) -> None:
        """Drop `name`'s trainer (under the lock); closed now if unused, else at release."""
        self._trainers.pop(name, None)
        if self._users.get(id(trainer)):
            self._retired[id(trainer)] = trainer
        else:
            to_close.append(trainer)


def _close_all(trainers: list[Trainer]) -> None:
    for trainer in trainers:
        try:
            trainer.close()
        except Exception:  # a trainer that cannot close cleanly is gone all the same
            logger.exception("closing a trainer failed")
