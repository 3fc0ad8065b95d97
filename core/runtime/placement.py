"""Which GPUs serve and which train, on one host.

`PlacementConfig` (in `EngineConfig.placement`) names the GPU indices (as torch numbers
the GPUs this process sees; under a `CUDA_VISIBLE_DEVICES` of the user's they are mapped
through it) that run vLLM and the one that runs the trainer. Left empty, it is derived
from what is visible:

- no GPU: nothing to place (vLLM CPU and the trainer share the cores);
- one GPU: colocated — vLLM and the trainer share GPU 0 (vLLM under
  `gpu_memory_utilization`);
- n >= 2 GPUs: dedicated — the trainer takes the last GPU and vLLM the others, one
  tensor-parallel engine across them.

vLLM gets its GPUs through `CUDA_VISIBLE_DEVICES` and `--tensor-parallel-size` /
`--data-parallel-size`; one training GPU runs the trainer in this process on
`cuda:<train GPU>`. Several training GPUs (named in `train_gpus`; never derived) run the
distributed trainer (`trainer/distributed.py`): one torchrun rank per GPU, FSDP2 over
nccl, the ranks seeing exactly the training GPUs through their own
`CUDA_VISIBLE_DEVICES`. Training GPUs shared with serving are allowed only in the
one-GPU colocated case.

`cpu_train_ranks` asks for the distributed trainer on the CPU instead (gloo): N ranks on
this host's cores. It exists to test the multi-rank path where there is no GPU, and is
refused where a GPU is visible.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlcoach.config import PlacementConfig
from rlcoach.errors import ConfigError

__all__ = ["Placement", "PlacementConfig", "resolve_placement"]


@dataclass(frozen=True, slots=True)
class Placement:
    """A validated placement on a host with `visible` GPUs."""

    serve_gpus: tuple[int, ...]
    train_gpus: tuple[int, ...]
    tensor_parallel: int
    data_parallel: int

    @property
    def colocated(self) -> bool:
        return bool(set(self.serve_gpus) & set(self.train_gpus))

    def vllm_env(self, inherited: str | None = None) -> dict[str, str]:
        """vLLM's `CUDA_VISIBLE_DEVICES`, mapped through the one this process runs under."""
        names = [n.strip() for n in inherited.split(",")] if inherited else None
        gpus = [names[g] if names else str(g) for g in self.serve_gpus]
        return {"CUDA_VISIBLE_DEVICES": ",".join(gpus)}

    def vllm_args(self) -> list[str]:
        args = []
        if self.tensor_parallel > 1:
            args += ["--tensor-parallel-size", str(self.tensor_parallel)]
        if self.data_parallel > 1:
            args += ["--data-parallel-size", str(self.data_parallel)]
        return args

    def train_device(self) -> str:
        return f"cuda:{self.train_gpus[0]}"

    def train_env(self, inherited: str | None = None) -> dict[str, str]:
        """The training ranks' `CUDA_VISIBLE_DEVICES` (rank i on `cuda:0` of its own view
        is training GPU i), mapped like `vllm_env`."""
        names = [n.strip() for n in inherited.split(",")] if inherited else None
        gpus = [names[g] if names else str(g) for g in self.train_gpus]
        return {"CUDA_VISIBLE_DEVICES": ",".join(gpus)}


def _check_indices(name: str, gpus: list[int], visible: int) -> None:
    bad = [g for g in gpus if not 0 <= g < visible]
    if bad:
        raise ConfigError(
            f"placement {name}={gpus} names GPU {bad[0]}, but this host has {visible} "
            f"visible GPU(s) (0..{visible - 1}); fix: use indices from `nvidia-smi -L`"
        )
    if len(set(gpus)) != len(gpus):
        raise ConfigError(f"placement {name}={gpus} lists a GPU twice; fix: list each once")


def resolve_placement(config: PlacementConfig, visible: int) -> Placement | None:
    """The placement for a host with `visible` GPUs (None without a GPU)."""
    if visible > 0 and config.cpu_train_ranks > 1:
        raise ConfigError(
            f"placement cpu_train_ranks={config.cpu_train_ranks} asks for CPU training ranks, "
            f"but {visible} GPU(s) are visible; fix: name several train_gpus to train on GPUs, "
            "or hide the GPUs (CUDA_VISIBLE_DEVICES=) to test the ranks on the CPU"
        )
    if visible == 0:
        if config.serve_gpus or config.train_gpus:
            raise ConfigError(
                f"placement serve_gpus={config.serve_gpus} train_gpus={config.train_gpus} "
                "names GPUs, but no GPU is visible here; fix: leave both empty on a CPU"
            )
        return None
    serve = list(config.serve_gpus)
    train = list(config.train_gpus)
    if not serve and not train:
        serve, train = ([0], [0]) if visible == 1 else (list(range(visible - 1)), [visible - 1])
    elif not train:
        rest = [g for g in range(visible) if g not in serve]
        train = [rest[-1]] if rest else [serve[-1]]
    elif not serve:
        rest = [g for g in range(visible) if g not in train]
        serve = rest or list(train)
    _check_indices("serve_gpus", serve, visible)
    _check_indices("train_gpus", train, visible)
    shared = sorted(set(serve) & set(train))
    if shared and (len(serve) > 1 or len(train) > 1):
        raise ConfigError(
            f"placement serve_gpus={serve} shares GPU {shared[0]} with train_gpus={train}; "
            "only a single GPU may be shared (colocated, one serving and one training); "
            "fix: serve on GPUs the trainer does not use"
        )
    data = config.data_parallel
    tensor = config.tensor_parallel or max(len(serve) // data, 1)
    if tensor * data != len(serve):
        raise ConfigError(
            f"placement tensor_parallel={tensor} x data_parallel={data} = {tensor * data} "
            f"does not match the {len(serve)} serving GPU(s) {serve}; fix: make their "
            "product the number of serving GPUs"
        )
    return Placement(tuple(serve), tuple(train), tensor, data)
