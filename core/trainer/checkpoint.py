"""A trainer checkpoint folder, and the one loader both trainers resume from.

A folder holds peft's own files (`adapter_config.json`, `adapter_model.safetensors`:
what vLLM and transformers load as is) and `optimizer.pt`, AdamW's `state_dict` with
whole (unsharded) tensors, its parameters in the order of the model's trainable
`named_parameters`. The backend writes the optimizer state after publishing the
adapter, so a folder without it is complete: AdamW then starts afresh, with a warning.

`load_checkpoint` serves the single-process trainer and every torchrun rank alike: each
saved tensor is copied into the parameter (or optimizer state) it belongs to, cut to
this rank's shard where the parameter is an FSDP2 `DTensor` (`shard_like`, with no
communication), so a checkpoint written by any number of ranks resumes on any other.
Everything is checked before anything is copied, and a folder that is missing, cannot
be read or does not fit the model raises `CheckpointError` naming what and the fix —
on every rank alike, before any collective, so the ranks live on to report it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from pickle import UnpicklingError
from typing import Any

import torch

from rlcoach.errors import CheckpointError

__all__ = [
    "ADAPTER_FILE",
    "OPTIMIZER_FILE",
    "full_tensor",
    "is_sharded",
    "load_checkpoint",
    "save_optimizer_state",
    "shard_like",
]

logger = logging.getLogger(__name__)

ADAPTER_FILE = "adapter_model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"

_DOES_NOT_FIT = (
    "fix: load a checkpoint of the same base model and LoRA settings (rank, "
    "target_modules), or train this configuration under a new model name"
)


def is_sharded(value: torch.Tensor) -> bool:
    """Whether `value` is an FSDP2 shard (a DTensor; never on a torch built without
    distributed support, where the single-process trainer still runs)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def full_tensor(value: torch.Tensor) -> torch.Tensor:
    """The whole tensor on the CPU (a collective for a sharded DTensor: every rank calls)."""
    whole = value.full_tensor() if is_sharded(value) else value  # type: ignore[attr-defined]  # a DTensor
    return whole.detach().cpu()


def shard_like(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`whole` as `like` holds it: its dtype and device, and this rank's shard where
    `like` is a DTensor (cut locally: no communication)."""
    whole = whole.to(dtype=like.dtype, device=like.device)
    if not is_sharded(like):
        return whole
    from torch.distributed.tensor import distribute_tensor

    mesh, placements = like.device_mesh, like.placements  # type: ignore[attr-defined]  # a DTensor
    return distribute_tensor(whole, mesh, placements, src_data_rank=None)


def save_optimizer_state(optimizer: torch.optim.Optimizer, folder: Path, *, write: bool) -> None:
    """Gather AdamW's state whole and, where `write`, save it atomically as
    `folder/optimizer.pt` (the ranks all gather; rank 0 alone writes)."""
    state = optimizer.state_dict()
    whole = {
        index: {key: full_tensor(value) for key, value in per_param.items()}
        for index, per_param in state["state"].items()
    }
    if write:
        temp = folder / f".{OPTIMIZER_FILE}.tmp"
        torch.save({"state": whole, "param_groups": state["param_groups"]}, temp)
        temp.replace(folder / OPTIMIZER_FILE)


def _read(path: Path, load: Any) -> Any:
    from safetensors import SafetensorError

    try:
        return load(path)
    except (OSError, EOFError, RuntimeError, ValueError, UnpicklingError, SafetensorError) as e:
        reason = f"{type(e).__name__}: {next(iter(str(e).splitlines()), '')}"
        raise CheckpointError(
            f"checkpoint file {path} cannot be read ({reason}); fix: delete the folder "
            f"{path.parent} so the run resumes from the step before it"
        ) from e


def _adapter_targets(model: Any) -> dict[str, torch.Tensor]:
    """peft's checkpoint key -> the trainable parameter (adapter name dropped, as saved)."""
    from peft import get_peft_model_state_dict

    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    return get_peft_model_state_dict(model, state_dict=named)


def _check_fits(folder: Path, what: str, saved: dict[Any, Any], targets: dict[Any, Any]) -> None:
    if set(saved) != set(targets):
        odd = sorted(map(str, set(saved) ^ set(targets)))
        raise CheckpointError(
            f"checkpoint {folder} does not fit this model: {len(odd)} {what} differ "
            f"between the checkpoint and the model, e.g. {odd[:3]}; {_DOES_NOT_FIT}"
        )
    for key, target in targets.items():
        if tuple(saved[key].shape) != tuple(target.shape):
            raise CheckpointError(
                f"checkpoint {folder} does not fit this model: {what[:-1]} {key} has shape "
                f"{tuple(saved[key].shape)} in the checkpoint and {tuple(target.shape)} in "
                f"the model; {_DOES_NOT_FIT}"
            )


def load_checkpoint(folder: Path, model: Any, optimizer: torch.optim.Optimizer) -> None:
    """Resume the peft `model`'s adapter weights and `optimizer`'s state from `folder`."""
    from safetensors.torch import load_file

    folder = Path(folder)
    adapter_file = folder / ADAPTER_FILE
    if not adapter_file.is_file():
        raise CheckpointError(
            f"checkpoint {folder} has no {ADAPTER_FILE}; fix: pass a checkpoint folder "
            "written by the trainer (a run's checkpoints/<step>/)"
        )
    weights = _read(adapter_file, lambda path: load_file(str(path)))
    targets = _adapter_targets(model)
    _check_fits(folder, "adapter weights", weights, targets)
    saved = None
    optimizer_file = folder / OPTIMIZER_FILE
    if optimizer_file.exists():
        saved = _read(optimizer_file, lambda path: torch.load(path, map_location="cpu"))
        params = [p for group in optimizer.param_groups for p in group["params"]]
        sizes = [len(group["params"]) for group in saved["param_groups"]]
        if sizes != [len(group["params"]) for group in optimizer.param_groups]:
            raise CheckpointError(
                f"checkpoint {folder} does not fit this model: its optimizer state is for "
                f"{sum(sizes)} parameters, the model trains {len(params)}; {_DOES_NOT_FIT}"
            )
        moments = {
            (i, k): v for i, s in saved["state"].items() for k, v in s.items() if k != "step"
        }
        _check_fits(
            folder,
            "optimizer moments",
            moments,
            {(i, k): params[i] for i, k in moments if i < len(params)},
        )
    with torch.no_grad():
        for key, param in targets.items():
            param.copy_(shard_like(weights[key], param))
    if saved is None:  # written after publishing: a crash in between leaves the adapter
        logger.warning("checkpoint %s has no optimizer state; AdamW starts afresh", folder)
        return
    state = {
        index: {
            key: value if key == "step" else shard_like(value, params[index])
            for key, value in per_param.items()
        }
        for index, per_param in saved["state"].items()
    }
    optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})
