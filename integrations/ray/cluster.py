"""Joining a Ray cluster and checking, before anything starts, that it can hold the run.

`connect(address)` imports Ray (a clear error naming the extra if it is missing), and
joins the cluster at `address` ("auto", "host:port", or None for the one this process
already joined, else a new local one), failing fast with the command that starts one
when nothing answers there. `check_room(config)` compares the placement the run asks for
(replicas x replica bundle + the trainer's bundle) with what the cluster's live nodes
have: a bundle that no single node can hold, or a total the cluster lacks, is refused
with what is missing and the fix.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

from rlcoach.errors import ConfigError, MissingDependencyError
from rlcoach.integrations.ray.config import RayConfig

__all__ = ["check_room", "connect", "import_ray"]


def import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise MissingDependencyError(
            f"RayBackend needs Ray, which is not installed ({e}); fix: pip install "
            "'rlcoach[ray]' (or `pip install ray` at the version in constraints.txt) on the "
            "driver and on every node of the cluster"
        ) from e
    return ray


def connect(address: str | None) -> Any:
    """Join the Ray cluster at `address` (see the module); return the `ray` module."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    if address and address not in ("auto", "local") and not address.startswith("ray://"):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host or "127.0.0.1", int(port)), timeout=5):
                pass
        except (OSError, ValueError) as e:
            raise ConfigError(
                f"no Ray cluster answers at address={address!r} ({e}); fix: start one with "
                "`ray start --head --port=6379` on the head node (and `ray start "
                "--address=<head>:6379` on the others), or pass the head's host:port"
            ) from e
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    except ConnectionError as e:
        raise ConfigError(
            f"could not join a Ray cluster at address={address!r} ({e}); fix: start one "
            "with `ray start --head` (address='auto' then finds it), or pass address=None "
            "to start a local one in this process"
        ) from e
    return ray


def _fits(bundle: Mapping[str, float], node: Mapping[str, float]) -> bool:
    return all(node.get(key, 0.0) >= amount for key, amount in bundle.items())


def _show(bundle: Mapping[str, float]) -> str:
    return ", ".join(
        f"{k}={v / 2**30:g} GiB" if k == "memory" else f"{k}={v:g}" for k, v in bundle.items()
    )


def check_room(ray: Any, config: RayConfig) -> None:
    """Refuse a placement the cluster cannot hold (see the module)."""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    roles = {
        "an inference replica": config.replica.bundle(),
        "the trainer": config.trainer.bundle(),
    }
    for role, bundle in roles.items():
        if not any(_fits(bundle, node) for node in nodes):
            have = "; ".join(_show({k: v for k, v in n.items() if "node:" not in k}) for n in nodes)
            raise ConfigError(
                f"no node of the Ray cluster can hold {role}, which asks for "
                f"{_show(bundle)}; the live nodes have: {have or 'none'}; fix: add a node "
                "with those resources (`ray start --address=<head> --num-gpus=... "
                "--resources='{...}'`), or ask for less (RayConfig.replica / .trainer)"
            )
    need: dict[str, float] = dict(config.trainer.bundle())
    for key, amount in config.replica.bundle().items():
        need[key] = need.get(key, 0.0) + amount * config.replicas
    totals = ray.cluster_resources()
    short = {k: (v, totals.get(k, 0.0)) for k, v in need.items() if totals.get(k, 0.0) < v}
    if short:
        missing = "; ".join(
            f"{_show({k: want})} asked, the cluster has {_show({k: have})}"
            for k, (want, have) in short.items()
        )
        raise ConfigError(
            f"the Ray cluster is too small for {config.replicas} replicas "
            f"({_show(config.replica.bundle())} each) and the trainer "
            f"({_show(config.trainer.bundle())}): {missing}; fix: add nodes, or lower "
            "RayConfig.replicas or the resources asked"
        )
