"""Rollout throughput of RayBackend with one and two inference replicas, same cluster.

    .venv/bin/python bench/ray_replicas.py                       # a local 2-node cluster
    .venv/bin/python bench/ray_replicas.py --address auto --gpus  # a real cluster

Starts a RayBackend with one replica, times `--rollouts` rollouts (bench/ray_task.py's
task, each in a Ray task through the entry point) after a warm-up, closes it, does the
same with two replicas on the same cluster, and prints rollouts per second of each and
the ratio. On this machine's CPU every replica and worker share two cores, so the ratio
shows the mechanism (requests spread over two engines), not the scaling; on GPUs (one per
replica) it measures the scaling.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time

from ray_task import QUESTIONS, local_cluster, ray_config, short_answer

from rlcoach import TrainableModel, gather_trajectories
from rlcoach.integrations.ray import RayBackend


async def throughput(config: dict, rollouts: int, base_model: str, root: str) -> float:
    """Rollouts per second with the replicas `config` asks for (after one warm-up wave)."""
    async with RayBackend(config, root=root) as backend:
        model = TrainableModel("bench", "ray-bench", base_model)
        await model.register(backend)
        rollout = backend.remote(short_answer)
        questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(rollouts)]
        await gather_trajectories([rollout(model, q) for q in questions[:4]], progress=False)
        started = time.perf_counter()
        done = await gather_trajectories([rollout(model, q) for q in questions], progress=False)
        elapsed = time.perf_counter() - started
        served = {r.replica_id: r.served for r in backend.entry.live()}
    print(
        f"  {config['replicas']} replica(s): {len(done)} rollouts in {elapsed:.1f} s, "
        f"requests per replica {sorted(served.values())}"
    )
    return len(done) / elapsed


def gpu_config(address: str | None, replicas: int) -> dict:
    return {
        "address": address,
        "replicas": replicas,
        "engine": {"kind": "vllm", "host": "0.0.0.0"},
        "entry_host": "0.0.0.0",
        "replica": {"num_cpus": 4, "num_gpus": 1},
        "trainer": {"num_cpus": 1, "num_gpus": 1},
    }


async def main(args: argparse.Namespace) -> None:
    rates = {}
    for replicas in (1, 2):
        config = gpu_config(args.address, replicas) if args.gpus else ray_config(replicas)
        if not args.gpus and args.address:
            config["address"] = args.address
        with tempfile.TemporaryDirectory() as root:
            rates[replicas] = await throughput(config, args.rollouts, args.base_model, root)
    print(
        f"rollouts/s: 1 replica {rates[1]:.2f}, 2 replicas {rates[2]:.2f}; "
        f"ratio {rates[2] / rates[1]:.2f}x"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=None, help="a running cluster (else a local one)")
    parser.add_argument("--gpus", action="store_true", help="vLLM replicas, one GPU each")
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--base-model", default="smollm2-135m-instruct")
    args = parser.parse_args()
    local = contextlib.nullcontext() if args.address else local_cluster(replica_nodes=2)
    with local:
        asyncio.run(main(args))
