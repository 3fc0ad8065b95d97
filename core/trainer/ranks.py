"""One training rank under torchrun: the worker half of the distributed trainer.

`DistributedTrainer` (distributed.py, whose docstring explains the design) starts one of
these per GPU or CPU rank with `python -m torch.distributed.run ... -m
rlcoach.trainer.ranks`. Rank 0 talks to the driver over a localhost socket and
broadcasts each command to the others; every rank holds an FSDP2-sharded copy of the
LoRA model, runs its share of each step's rows (`split_by_tokens`) and joins the
gathers that write a checkpoint once. The step itself is step.py's `grpo_step`, the one
the single-process trainer runs, with this module's two hooks (`_RankTrainer.rows`,
`_RankTrainer.sum_over_ranks`); loading is checkpoint.py's `load_checkpoint`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from rlcoach.config import TrainConfig
from rlcoach.errors import CheckpointError, ConfigError, TrainingDataError
from rlcoach.runtime.hardware import autocast, upload
from rlcoach.trainer.base import StepStats
from rlcoach.trainer.checkpoint import full_tensor, load_checkpoint, save_optimizer_state
from rlcoach.trainer.lora import (
    build_lora_model,
    build_optimizer,
    chunked_token_logprobs,
    serving_dtype,
)
from rlcoach.trainer.sequences import (
    PackedRow,
    Segment,
    SharedPrefix,
    TrainSequence,
    pack_sequences,
    pack_shared,
    share_prefixes,
)
from rlcoach.trainer.step import grpo_step
from rlcoach.trajectory.trajectories import TrajectoryGroup

__all__ = ["TOKEN_VARIABLE", "main", "split_by_tokens"]

TOKEN_VARIABLE = "RLCOACH_RANK_TOKEN"
"""The environment variable that carries the driver's token to rank 0."""

logger = logging.getLogger(__name__)


Item = TypeVar("Item", TrainSequence, SharedPrefix)


def _tokens(item: TrainSequence | SharedPrefix) -> int:
    return item.tokens if isinstance(item, SharedPrefix) else len(item.token_ids)


def split_by_tokens(items: list[Item], ranks: int) -> list[list[Item]]:
    """Deal sequences (or shared-prefix units) to `ranks` by token count: longest first,
    each to the rank with the fewest tokens so far (ties: the lowest rank). Deterministic
    on every rank."""
    shares: list[list[Item]] = [[] for _ in range(ranks)]
    tokens = [0] * ranks
    for item in sorted(items, key=_tokens, reverse=True):
        rank = tokens.index(min(tokens))
        shares[rank].append(item)
        tokens[rank] += _tokens(item)
    return shares


_IDLE_S = 60.0
"""Seconds rank 0 waits for a command before waking the other ranks (see `_serve`)."""

_PADDING_SEQUENCE = TrainSequence([0, 0], [0, 0], [0.0, 0.0], 0.0, "padding")


class _RowLogprobs(torch.nn.Module):
    """FSDP's root: one call is one row's token log-probs (with or without the adapter)."""

    def __init__(self, peft_model: Any, chunk: int) -> None:
        super().__init__()
        self.peft_model = peft_model
        self.chunk = chunk

    def forward(
        self,
        ids_1T: torch.Tensor,
        positions_1T: torch.Tensor,
        use_adapter: bool,
        segments: tuple[Segment, ...] = (),
    ) -> torch.Tensor:
        causal_lm = self.peft_model.get_base_model()
        if use_adapter:
            return chunked_token_logprobs(
                causal_lm, ids_1T, positions_1T, self.chunk, segments=segments
            )
        with self.peft_model.disable_adapter():
            return chunked_token_logprobs(
                causal_lm, ids_1T, positions_1T, self.chunk, segments=segments
            )


class _RankTrainer:
    """One rank's share of the model and optimizer, and its part of each command."""

    def __init__(self, model_path: str, config: TrainConfig, device: torch.device) -> None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard

        self.config = config
        self.device = device
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        # Compiled or fused layers are not tried under FSDP2 yet (module docstring).
        plain = config.model_copy(update={"compile_layers": False, "fused_lora": False})
        self.model = build_lora_model(model_path, plain, device)
        mesh = init_device_mesh(device.type, (self.world,))
        for layer in self.model.get_base_model().get_decoder().layers:
            fully_shard(layer, mesh=mesh)
        root: Any = fully_shard(_RowLogprobs(self.model, config.logprob_chunk_tokens), mesh=mesh)
        self.root = root
        for module in root.modules():
            if isinstance(module, FSDPModule):
                # Sum over ranks, not the mean; as a plain SUM (gloo has no PREMUL_SUM).
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)
        self.optimizer = build_optimizer(self.model, config, fused=False)

    def row_logprobs(self, row: PackedRow, use_adapter: bool = True) -> torch.Tensor:
        ids, positions = (
            upload(row.input_ids_T[None], self.device),
            upload(row.position_ids_T[None], self.device),
        )
        with autocast(self.device):  # as LoraTrainer: bf16 only where it is fast
            if use_adapter:
                return self.root(ids, positions, True, row.segments)
            with torch.no_grad():
                return self.root(ids, positions, False, row.segments)

    # -- the step's hooks (step.py): this rank's share of the rows, sums over all ranks

    def rows(self, part: list[TrainSequence], config: TrainConfig) -> list[PackedRow]:
        """This rank's rows of mini-batch `part`, padded with zero-weight rows up to the
        most any rank has (FSDP needs as many passes on every rank)."""
        import torch.distributed as dist

        size = config.micro_batch_tokens
        if config.share_prefix:  # whole units go to a rank: a prefix stays with its suffixes
            rows = pack_shared(
                split_by_tokens(share_prefixes(part, size), self.world)[self.rank], size
            )
        else:
            rows = pack_sequences(split_by_tokens(part, self.world)[self.rank], size)
        most = int(self._reduce([len(rows)], dist.ReduceOp.MAX)[0])
        padding = pack_sequences([_PADDING_SEQUENCE], config.micro_batch_tokens)
        return rows + padding * (most - len(rows))

    def sum_over_ranks(self, values: list[float]) -> list[float]:
        return self._reduce(values)

    def max_over_ranks(self, values: list[float]) -> list[float]:
        import torch.distributed as dist

        return self._reduce(values, dist.ReduceOp.MAX)

    def _reduce(self, values: list[float], op: Any = None) -> list[float]:
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM)
        return tensor.tolist()

    def step(self, groups: list[TrajectoryGroup], config: TrainConfig) -> StepStats:
        return grpo_step(self, groups, config)

    def save_adapter(self, folder: Path, serving: bool = False) -> None:
        import torch.distributed as dist

        named = {n: full_tensor(p) for n, p in self.model.named_parameters() if p.requires_grad}
        if serving:
            named = {n: t.to(serving_dtype(self.model)) for n, t in named.items()}
        if self.rank == 0:
            self.model.save_pretrained(folder, state_dict=named)
        dist.barrier()

    def save_optimizer(self, folder: Path) -> None:
        import torch.distributed as dist

        save_optimizer_state(self.optimizer, folder, write=self.rank == 0)
        dist.barrier()

    def load(self, folder: Path) -> None:
        load_checkpoint(folder, self.model, self.optimizer)

    def run(self, command: Mapping[str, Any]) -> dict[str, Any]:
        name = command["cmd"]
        if name == "step":
            text = Path(command["groups"]).read_text(encoding="utf-8")
            groups = [TrajectoryGroup.model_validate_json(line) for line in text.splitlines()]
            config = TrainConfig.model_validate(command["config"])
            return self.step(groups, config).as_dict()
        folder = Path(command["folder"])
        if name == "save_adapter":
            self.save_adapter(folder, serving=bool(command.get("serving")))
        elif name == "save_optimizer":
            self.save_optimizer(folder)
        elif name == "load":
            self.load(folder)
        else:
            raise ConfigError(f"unknown trainer command {name!r}")
        return {}


class _Channel:
    """Rank 0's end of the driver's socket: JSON lines both ways."""

    def __init__(self, port: int, token: str) -> None:
        self.socket = socket.create_connection(("127.0.0.1", port))
        self.buffer = b""
        self.send({"token": token})

    def send(self, message: dict[str, Any]) -> None:
        self.socket.sendall((json.dumps(message) + "\n").encode())

    def receive(self, idle_s: float) -> dict[str, Any]:
        """The next command; `idle` after `idle_s` without one, `close` if the driver is gone."""
        while b"\n" not in self.buffer:
            if not select.select([self.socket], [], [], idle_s)[0]:
                return {"cmd": "idle"}
            chunk = self.socket.recv(1 << 16)
            if not chunk:
                return {"cmd": "close"}
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)


def _serve(trainer: _RankTrainer, channel: _Channel | None) -> None:
    """Run the driver's commands until `close`, every rank in step with rank 0."""
    import torch.distributed as dist

    while True:
        # Between steps (rollouts can take an hour) rank 0 wakes the others every
        # `_IDLE_S`, so no rank sits in one collective long enough to hit its timeout.
        box = [channel.receive(_IDLE_S) if channel is not None else None]
        dist.broadcast_object_list(box, src=0)
        command = box[0]
        assert command is not None  # every rank holds rank 0's command after the broadcast
        if command["cmd"] == "close":
            return
        if command["cmd"] == "idle":
            continue
        try:
            reply = {"id": command["id"], "ok": True, "result": trainer.run(command)}
        except (TrainingDataError, ConfigError, CheckpointError) as e:
            reply = {"id": command["id"], "ok": False, "kind": type(e).__name__, "error": str(e)}
        if channel is not None:
            channel.send(reply)


def main(argv: list[str] | None = None) -> None:
    """One rank, as torchrun starts it (`RANK`, `WORLD_SIZE`, `LOCAL_RANK` in the env)."""
    import torch.distributed as dist

    parser = argparse.ArgumentParser(description="an rlcoach training rank (run by torchrun)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--config", required=True, help="TrainConfig as JSON")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--driver-port", type=int, required=True)
    args = parser.parse_args(argv)
    # The driver's token comes in the environment: a command line is readable by all.
    token = os.environ.pop(TOKEN_VARIABLE, "")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    line = f"%(asctime)s rank {rank} %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO, format=line)
    channel = _Channel(args.driver_port, token) if rank == 0 else None

    def progress(message: str) -> None:
        logger.info(message)
        if channel is not None:
            channel.send({"event": "progress", "message": message})

    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # ranks share the cores
    progress(f"{world} ranks up; joining the {args.backend} process group")
    dist.init_process_group(args.backend)
    try:
        progress("loading the model and sharding it (FSDP2)")
        config = TrainConfig.model_validate_json(args.config)
        trainer = _RankTrainer(args.model, config, device)
        pids: list[Any] = [None] * world
        dist.all_gather_object(pids, os.getpid())
        if channel is not None:
            channel.send({"event": "ready", "pids": pids})
        _serve(trainer, channel)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
