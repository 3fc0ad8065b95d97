"""A LoRA trainer spread over several ranks: torchrun workers, FSDP2, one driver.

`DistributedTrainer` lives in the backend's process and is a `Trainer` (base.py), as
`LoraTrainer` is: `step`, `save_adapter`, `save_optimizer`, `save`, `load`, `close`,
`closed`. It starts the ranks once with the real launcher (`python -m
torch.distributed.run --standalone --nproc-per-node N -m rlcoach.trainer.ranks ...`; the
ranks live in ranks.py), listens on a localhost socket that rank 0 connects to, and
sends it one JSON line per command; rank 0 broadcasts each command to the other ranks
(`broadcast_object_list`) and answers with one JSON line. Groups travel as a JSON-lines
file written atomically beside the driver's socket, not through the socket. A rank that
dies, or a command that runs past its timeout, raises `TrainerError` naming the workers'
log; the driver never waits on a dead process.

Each rank builds the model exactly as `LoraTrainer` does (`build_lora_model`, same seed,
so the same initial adapter) and applies FSDP2: `fully_shard` on every decoder layer,
then on a small root module whose forward is a whole row's log-probs, so the
embeddings, the final norm and a tied output layer are gathered around the one call
that uses them (the output projection runs outside the decoder, in chunks).

**The LoRA weights are sharded with the base weights**, not replicated: they ride in
the all-gather FSDP already issues for their layer, their gradients are reduce-scattered
in the one collective the layer already has (base weights are frozen: it carries only
LoRA gradients), and AdamW's state (twice the adapter) is split N ways. Replicating them
would need `ignored_params` plus an all-reduce of our own per step for a saving of a
few hundred kB of all-gather per layer; not measured, since sharding costs nothing extra.

A step is the single process's step (step.py's `grpo_step`, run by every rank) split by
rows: the same sequences (`collect_sequences`) and mini-batches on every rank; each
mini-batch's sequences are dealt to the ranks by token count (longest first, to the rank
with the fewest tokens), and each rank packs its own rows. The loss normaliser is the
whole mini-batch's, and FSDP sums the gradients (divide factor 1 and a plain SUM, which
gloo has, instead of its default mean), so the reduced gradient is the single process's.
FSDP hangs unless every rank runs as many forward and backward passes as the others: a
rank with fewer rows runs padding rows (two tokens, nothing sampled: zero loss, zero
gradient) up to the most any rank has. Stats are summed across ranks and mean what they
mean in one process.

Checkpoints are written once, by rank 0: the adapter gathered whole (`full_tensor`) in
peft's own files and keys, and AdamW's state gathered whole in the single-process
`optimizer.pt` format, so a checkpoint resumes on any number of ranks. `load` runs on
every rank (checkpoint.py's loader, the single process's), each cutting its own shard
from the full tensors.

Departures from the single-process trainer: on a GPU the layers are neither compiled nor
LoRA-fused, and AdamW is not the fused kernel (none of them is tried with FSDP2 yet). SFT
is not built on it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, NoReturn

from rlcoach.config import TrainConfig
from rlcoach.errors import CheckpointError, ConfigError, TrainerError, TrainingDataError
from rlcoach.paths import write_text_atomic
from rlcoach.runtime.processes import parent_death_signal
from rlcoach.trainer.base import StepStats
from rlcoach.trajectory.trajectories import TrajectoryGroup

__all__ = ["RANK_MODULE", "DistributedTrainer"]

logger = logging.getLogger(__name__)

_ERROR_LINE = re.compile(r"(\[rank\d+\]: )?[\w.]*(Error|Exception)\b")
"""An exception's last line in the ranks' log (torchrun prefixes `[rank<n>]: `)."""

RANK_MODULE = "rlcoach.trainer.ranks"
"""The module torchrun runs in each rank (`-m`); its name in a process's command line is
also how `_stop` recognises a leftover rank as one of ours before killing it."""

_STOP_GRACE_S = 15.0
"""Seconds torchrun gets to stop its ranks after SIGTERM before it is killed."""

_PASSED_ON = {
    "TrainingDataError": TrainingDataError,
    "ConfigError": ConfigError,
    "CheckpointError": CheckpointError,
}
"""Errors every rank raises alike before any collective: reported, the ranks live on."""


# ---------------------------------------------------------------- the driver


class DistributedTrainer:
    """The ranks' driver, in the backend's process: `LoraTrainer`'s methods over torchrun.

    `ranks` processes under `backend` ("nccl": one GPU each, the GPUs named by
    `env["CUDA_VISIBLE_DEVICES"]`; "gloo": CPU ranks). `start_timeout_s` bounds the start
    (model load included), `call_timeout_s` each command."""

    def __init__(
        self,
        model_path: str | Path,
        config: TrainConfig,
        *,
        ranks: int,
        backend: Literal["gloo", "nccl"] = "gloo",
        env: Mapping[str, str] | None = None,
        log_file: Path | None = None,
        start_timeout_s: float = 600.0,
        call_timeout_s: float = 3600.0,
    ) -> None:
        if ranks < 2:
            raise ConfigError(
                f"DistributedTrainer ranks={ranks}: it spreads training over "
                "ranks; fix: use LoraTrainer for one, or ranks >= 2"
            )
        from rlcoach.engines.process import child_environment
        from rlcoach.trainer.ranks import TOKEN_VARIABLE

        self.config = config
        self.call_timeout_s = call_timeout_s
        self._work = Path(tempfile.mkdtemp(prefix="rlcoach-ranks-"))
        self.log_file = log_file or self._work / "workers.log"
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.5)
        self._connection: socket.socket | None = None
        self._buffer = b""
        self._next_id = 0
        self.closed = False
        self.worker_pids: list[int] = []
        token = secrets.token_hex(16)
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(ranks),
            "--max-restarts",
            "0",
            "-m",
            RANK_MODULE,
            "--model",
            str(model_path),
            "--config",
            config.model_dump_json(),
            "--backend",
            backend,
            "--driver-port",
            str(self._server.getsockname()[1]),
        ]
        with open(self.log_file, "ab") as log:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_environment({**(env or {}), TOKEN_VARIABLE: token}),
                start_new_session=True,
                preexec_fn=parent_death_signal(),
            )
        logger.info(
            "starting %d training ranks (%s) under torchrun (pid %d); log: %s",
            ranks,
            backend,
            self._process.pid,
            self.log_file,
        )
        try:
            deadline = time.monotonic() + start_timeout_s
            self._connection = self._accept(deadline)
            hello = self._receive(deadline, "start")
            if hello.get("token") != token:
                raise TrainerError(
                    "a process that is not our rank 0 connected to the "
                    "trainer's socket; fix: retry (the port was taken)"
                )
            ready = self._wait(None, deadline, "start")
            self.worker_pids = [int(p) for p in ready["pids"]]
        except BaseException:
            self._stop()
            raise
        logger.info("training ranks ready (pids %s)", self.worker_pids)

    # -- LoraTrainer's methods

    def step(self, groups: list[TrajectoryGroup], config: TrainConfig | None = None) -> StepStats:
        """Train on `groups` across the ranks; stats as `LoraTrainer.step` returns them."""
        c = config or self.config
        path = write_text_atomic(
            self._work / f"groups-{self._next_id}.jsonl",
            "".join(g.model_dump_json() + "\n" for g in groups),
        )
        try:
            result = self._call(
                {"cmd": "step", "groups": str(path), "config": c.model_dump(mode="json")}
            )
        finally:
            path.unlink(missing_ok=True)
        return StepStats(**result)

    def save(self, folder: Path) -> None:
        """Write the peft adapter and the optimizer state (rank 0 writes, once)."""
        self.save_adapter(folder)
        self.save_optimizer(folder)

    def save_adapter(self, folder: Path, serving: bool = False) -> None:
        """Write the whole adapter, in peft's files and keys (as `LoraTrainer` writes it)."""
        folder_text = str(Path(folder).absolute())
        self._call({"cmd": "save_adapter", "folder": folder_text, "serving": serving})

    def save_optimizer(self, folder: Path) -> None:
        """Write AdamW's whole state atomically (the single-process `optimizer.pt`)."""
        self._call({"cmd": "save_optimizer", "folder": str(Path(folder).absolute())})

    def load(self, folder: Path) -> None:
        """Resume adapter weights and optimizer state on every rank from a checkpoint."""
        self._call({"cmd": "load", "folder": str(Path(folder).absolute())})

    def close(self) -> None:
        """Stop the ranks (asked first, then signalled) and remove the driver's files."""
        if not self.closed and self._connection is not None:
            try:
                self._connection.sendall(b'{"cmd": "close"}\n')
                self._process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._stop()

    def __enter__(self) -> DistributedTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the socket

    def _call(self, command: dict[str, Any]) -> dict[str, Any]:
        if self.closed or self._connection is None:
            raise TrainerError(
                f"the training ranks are stopped (log: {self.log_file}); fix: "
                "make a new trainer, which resumes from a checkpoint"
            )
        self._next_id += 1
        command = {**command, "id": self._next_id}
        deadline = time.monotonic() + self.call_timeout_s
        try:
            self._connection.sendall((json.dumps(command) + "\n").encode())
        except OSError:
            self._failure(command["cmd"], "rank 0 closed the connection")
        reply = self._wait(self._next_id, deadline, command["cmd"])
        if reply["ok"]:
            return reply["result"]
        raise _PASSED_ON.get(reply.get("kind", ""), TrainerError)(reply["error"])

    def _accept(self, deadline: float) -> socket.socket:
        while True:
            try:
                connection, _ = self._server.accept()
                connection.settimeout(0.5)
                return connection
            except TimeoutError:
                self._check(deadline, "start")

    def _wait(self, reply_id: int | None, deadline: float, what: str) -> dict[str, Any]:
        """The reply to `reply_id` (None: the ready message), logging progress meanwhile."""
        while True:
            message = self._receive(deadline, what)
            if message.get("event") == "progress":
                logger.info("training ranks: %s", message["message"])
                continue
            ready = message.get("event") == "ready"
            if (reply_id is None and ready) or (
                reply_id is not None and message.get("id") == reply_id
            ):
                return message

    def _receive(self, deadline: float, what: str) -> dict[str, Any]:
        assert self._connection is not None
        while b"\n" not in self._buffer:
            try:
                chunk = self._connection.recv(1 << 16)
            except TimeoutError:
                self._check(deadline, what)
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self._failure(what, "rank 0 closed the connection")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def _check(self, deadline: float, what: str) -> None:
        if self._process.poll() is not None:
            self._failure(what, f"torchrun exited with code {self._process.returncode}")
        if time.monotonic() > deadline:
            self._failure(what, "it ran past its timeout")

    def _failure(self, what: str, reason: str) -> NoReturn:
        # torchrun notices a lost rank within a second; give it that long to exit.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=5)
        code = self._process.poll()
        self._stop()
        tail = _tail(self.log_file)
        raise TrainerError(
            f"the training ranks failed during {what}: {reason}"
            + (f" (torchrun exit code {code})" if code is not None else "")
            + f"; their log is {self.log_file}, ending:\n{tail}\nfix: read the log for the "
            "failing rank's error; the next step makes a new trainer from the latest checkpoint"
        )

    def _stop(self) -> None:
        """Stop torchrun (it stops its ranks), then any rank still alive; forget the socket."""
        self.closed = True
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        for pid in self.worker_pids:  # a rank torchrun could not stop (checked: still ours)
            try:
                if RANK_MODULE.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for handle in (self._connection, self._server):
            if handle is not None:
                handle.close()
        self._connection = None
        if self.log_file.parent != self._work:
            shutil.rmtree(self._work, ignore_errors=True)


def _tail(path: Path) -> str:
    """The ranks' error lines from their log (else its last lines)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    errors = [line for line in lines if _ERROR_LINE.match(line)]
    return "\n".join(dict.fromkeys(errors[-4:]) if errors else lines[-10:])
