"""A local multi-node Ray cluster and a light task for RayBackend's tests and benchmark.

`local_cluster(replica_nodes)` starts a Ray cluster of several nodes on this machine
(`ray.cluster_utils.Cluster`: a head holding the trainer, `replica_nodes` nodes holding
one inference replica each via the custom resource `replica`), no dashboard and a small
object store. The rollout (`short_answer`) asks the policy one question and rewards
short replies (1 - sampled tokens / max_tokens, characters breaking ties): a signal
the bundled model learns in a few steps, so a short run's reward rises. Rollout
functions run in Ray tasks, which import this module by name: the cluster is started
with `bench/` on `PYTHONPATH`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlcoach import TrainableModel, Trajectory

MAX_TOKENS = 32
QUESTIONS = [
    "In one word: name a colour.",
    "In one word: what is 2+2?",
    "In one word: name an animal.",
    "In one word: say hello.",
]
NODE_CPUS = 2
OBJECT_STORE = 80 * 2**20


async def short_answer(model: TrainableModel, question: str) -> Trajectory:
    """One rollout: a question, reward 1 - tokens/MAX_TOKENS (short replies win)."""
    client = model.openai_client()
    async with model.rollout(question=question) as rollout:
        reply = await client.chat.completions.create(
            model=model.served_name,
            messages=[{"role": "user", "content": question}],
            max_tokens=MAX_TOKENS,
            temperature=1.0,
        )
        used = reply.usage.completion_tokens if reply.usage else MAX_TOKENS
        text = reply.choices[0].message.content or ""
        # Fewer tokens win; the characters break ties, so a group always has a spread.
        rollout.reward = 1.0 - used / MAX_TOKENS - len(text) / (100 * MAX_TOKENS)
    return rollout.trajectory


def ray_config(replicas: int, engine: dict[str, Any] | None = None) -> dict[str, Any]:
    """A `RayConfig` for `local_cluster`: replicas on `replica` nodes, trainer on the head."""
    return {
        "address": None,
        "replicas": replicas,
        "engine": engine or {"kind": "transformers", "max_model_len": 512},
        "replica": {"num_cpus": 1, "resources": {"replica": 1}},
        "trainer": {"num_cpus": 1, "resources": {"trainer": 1}},
        "rollout_worker": {"num_cpus": 0.25},
        "startup_timeout_s": 300,
    }


def add_replica_node(cluster: Any) -> Any:
    return cluster.add_node(
        num_cpus=NODE_CPUS, resources={"replica": 1}, object_store_memory=OBJECT_STORE
    )


@contextlib.contextmanager
def local_cluster(replica_nodes: int) -> Iterator[Any]:
    """A Ray cluster of a head and `replica_nodes` nodes on this machine (see module);
    this process joins it, and everything is shut down on exit."""
    import ray
    from ray.cluster_utils import Cluster

    bench = str(Path(__file__).resolve().parent)
    paths = [bench, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": NODE_CPUS,
            "resources": {"trainer": 1},
            "include_dashboard": False,
            "object_store_memory": OBJECT_STORE,
        },
    )
    try:
        for _ in range(replica_nodes):
            add_replica_node(cluster)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
