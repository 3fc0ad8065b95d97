"""RayBackend on a real local Ray cluster: a head (the trainer) and two nodes holding one
inference replica each (bench/ray_task.py), the bundled model served by the
transformers engine in each replica (vLLM twice is too heavy for CI's two cores; the
vLLM replica has its own test, test_ray_vllm.py). The cluster and the backend start
once for the module; the tests run in order: the bad placements refused, two replicas
serving a short run whose reward rises, a replica's node killed mid-rollouts (nothing
lost, the replica replaced once a node has room), the trainer actor killed (the run
resumes from the last committed step), nothing left on the cluster after close, and the
example (examples/ray_cluster/run.py) run against the same cluster."""

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from rlcoach import TrainableModel, gather_trajectory_groups
from rlcoach.errors import ConfigError

ray = pytest.importorskip("ray")

from ray_task import QUESTIONS, add_replica_node, local_cluster, ray_config, short_answer  # noqa: E402

from rlcoach.integrations.ray import RayBackend  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(replica_nodes=2) as c:
        yield c


@pytest.fixture(scope="module")
async def run(cluster, tmp_path_factory):
    backend = RayBackend(ray_config(replicas=2), root=tmp_path_factory.mktemp("ray-run"))
    model = TrainableModel("short", "ray", config={"learning_rate": 5e-3, "seed": 0})
    await model.register(backend)
    yield backend, model
    await backend.close()


async def _step(backend, model, attempts=4):
    rollout = backend.remote(short_answer)
    return await gather_trajectory_groups(
        [[rollout(model, q) for _ in range(attempts)] for q in QUESTIONS[:2]], progress=False
    )


def _arrived(groups, expected):
    trajectories = [t for g in groups for t in g.trajectories]
    assert len(trajectories) == expected and not [f for g in groups for f in g.failures]
    # Every trajectory holds its recorded call: the replica's recorder gave it back.
    assert all(t.messages and t.choices for t in trajectories)
    return sum(t.reward for t in trajectories) / expected


def test_a_placement_the_cluster_cannot_hold_is_refused_before_anything_starts(cluster):
    with pytest.raises(ConfigError, match=r"GPU=1.*fix: add a node"):
        RayBackend({**ray_config(2), "replica": {"num_gpus": 1}})
    with pytest.raises(ConfigError, match=r"too small for 3 replicas.*replica=3 asked"):
        RayBackend(ray_config(3))
    assert ray.util.placement_group_table() == {}


async def test_two_replicas_serve_and_a_short_run_raises_the_reward(run):
    backend, model = run
    rewards = []
    for _ in range(4):
        groups = await _step(backend, model)
        rewards.append(_arrived(groups, 8))
        result = await model.train(groups)
        assert result.metrics["rollouts_retried"] == 0 and result.metrics["replicas"] == 2
    print(f"mean reward per step: {rewards}")
    # 8 rollouts a step are noisy: the policy after two and three steps against the base.
    assert sum(rewards[2:]) / 2 > rewards[0] + 0.05, rewards
    # A step whose every group answered alike (the short reply learned) trains nothing.
    step = model.step
    assert step >= 3 and model.served_name == f"short@{step}"
    replicas = list(backend.entry.replicas.values())
    assert len(replicas) == 2 and all(r.served >= 4 and r.latest["short"] == step for r in replicas)
    assert (backend.paths(model).checkpoint(step) / "adapter_model.safetensors").is_file()
    async with httpx.AsyncClient(base_url=backend.url, timeout=120) as http:
        names = {m["id"] for m in (await http.get("/v1/models")).json()["data"]}
        body = {"model": "short@1", "messages": [{"role": "user", "content": "Hi"}]}
        reply = (await http.post("/v1/chat/completions", json={**body, "max_tokens": 2})).json()
    assert {"short@0", f"short@{step}"} <= names and reply["model"] == "short@1"


async def test_killing_a_replicas_node_mid_rollouts_loses_nothing(run, cluster):
    backend, model = run
    victim_id, victim = next(iter(backend.replicas.items()))
    node_id = await victim.actor.node_id.remote()
    node = next(n for n in cluster.worker_nodes if n.node_id == node_id)
    pending = asyncio.ensure_future(_step(backend, model))
    state = backend.entry.replicas[victim_id]
    for _ in range(60_000):  # kill it while it serves rollouts
        if state.inflight:
            break
        await asyncio.sleep(0.005)
    cluster.remove_node(node, allow_graceful=False)
    groups = await pending
    _arrived(groups, 8)
    retried = sum(t.metadata["ray_retries"] for g in groups for t in g.trajectories)
    assert retried >= 1 and backend.retried == retried
    result = await model.train(groups)
    assert result.metrics["rollouts_retried"] == retried
    assert result.metrics["replicas_lost"] == 1 and result.metrics["replicas"] == 1
    # No node has room for a replica now; one joins and the replica is replaced there.
    add_replica_node(cluster)
    for _ in range(600):
        if len(backend.entry.live()) == 2:
            break
        await asyncio.sleep(0.2)
    live = backend.entry.live()
    assert len(live) == 2 and victim_id not in backend.entry.replicas
    assert all(r.latest["short"] == model.step for r in live)
    _arrived(await _step(backend, model, attempts=2), 4)


async def test_the_trainer_actor_dies_and_the_run_resumes_from_the_last_commit(run):
    backend, model = run
    committed = model.step
    groups = await _step(backend, model, attempts=2)
    for group in groups:  # the trained policy may answer alike: give each group a spread
        for rank, trajectory in enumerate(group.trajectories):
            trajectory.reward = float(rank)
    old = backend.trainer.actor
    ray.kill(old, no_restart=True)
    result = await model.train(groups)
    assert backend.trainer.actor is not old
    assert result.step == committed + 1 and model.served_name == f"short@{committed + 1}"
    assert backend.paths(model).checkpoint(committed + 1).is_dir()


async def test_close_leaves_nothing_of_the_run_on_the_cluster(run):
    backend, _ = run
    assert (
        len([g for g in ray.util.placement_group_table().values() if g["state"] == "CREATED"]) == 3
    )
    await backend.close()
    assert all(g["state"] == "REMOVED" for g in ray.util.placement_group_table().values())
    for _ in range(100):  # the actors' resources come back as they end
        if ray.available_resources().get("replica") == ray.cluster_resources().get("replica"):
            break
        await asyncio.sleep(0.1)
    assert ray.available_resources().get("replica") == ray.cluster_resources()["replica"] == 2
    assert ray.available_resources().get("trainer") == 1


def test_the_example_runs_across_the_cluster(cluster, tmp_path):
    """examples/ray_cluster/run.py (docs/scale-out.md's command), one step on this cluster."""
    example = ROOT / "examples" / "ray_cluster" / "run.py"
    command = [sys.executable, str(example), "--address", cluster.address]
    command += ["--steps", "1", "--group-size", "2", "--root", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"step 1: mean reward -?[\d.]+ over 4 trajectories, 0 retried", done.stdout)
