"""RayBackend's set-up without a cluster: what is refused before anything starts (Ray
missing, no cluster at the address), the resources asked of Ray, and the launch files
for real clusters (SkyPilot's task, KubeRay's RayJob), read as YAML and checked for the
keys each tool requires and for the example's own flags. (SkyPilot and KubeRay's own
parsers are not installed here: SkyPilot pulls cloud SDKs that would move our pins, and
KubeRay's schema lives in the cluster's CRD.)"""

import re
import sys
from pathlib import Path

import pytest
import yaml

from rlcoach.config import parse_config
from rlcoach.errors import ConfigError, MissingDependencyError
from rlcoach.integrations.ray.cluster import connect, import_ray
from rlcoach.integrations.ray.config import RayConfig, Resources

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ray_cluster"


def test_without_ray_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'rlcoach\[ray\]'"):
        import_ray()


def test_no_cluster_at_the_address_is_refused_with_the_command_that_starts_one():
    pytest.importorskip("ray")
    with pytest.raises(ConfigError, match=r"127.0.0.1:1.*ray start --head"):
        connect("127.0.0.1:1")


def test_resources_become_rays_bundle_and_options():
    asked = Resources(num_cpus=4, num_gpus=1, memory_gib=8, resources={"replica": 1})
    assert asked.bundle() == {"CPU": 4, "GPU": 1, "replica": 1, "memory": 8 * 2**30}
    assert asked.options() == {
        "num_cpus": 4,
        "num_gpus": 1,
        "memory": 8 * 2**30,
        "resources": {"replica": 1},
    }
    assert Resources(num_cpus=0.5).bundle() == {"CPU": 0.5}
    with pytest.raises(ConfigError, match="replicas"):
        parse_config(RayConfig, {"replicas": 0})


def _flags_exist(command: str) -> None:
    source = (EXAMPLE / "run.py").read_text()
    for flag in re.findall(r"--[a-z][a-z-]+", command):
        assert f'"{flag}"' in source, flag


def _pinned_ray() -> str:
    line = next(
        x for x in (ROOT / "constraints.txt").read_text().splitlines() if x.startswith("ray==")
    )
    return line.split("==")[1]


def test_the_skypilot_task_starts_a_ray_cluster_and_runs_the_example():
    task = yaml.safe_load((EXAMPLE / "skypilot.yaml").read_text())
    assert set(task) <= {
        "name",
        "num_nodes",
        "resources",
        "workdir",
        "envs",
        "setup",
        "run",
        "file_mounts",
    }
    assert task["num_nodes"] >= 2 and task["resources"]["accelerators"]
    assert "'.[vllm,ray]'" in task["setup"] and "constraints.txt" in task["setup"]
    run = task["run"]
    assert "ray start --head" in run and "ray start --address=$HEAD_IP" in run
    assert "examples/ray_cluster/run.py --address auto" in run
    _flags_exist(run.split("run.py", 1)[1].split("ray stop")[0])


def test_the_kuberay_rayjob_has_the_keys_kuberay_requires():
    job = yaml.safe_load((EXAMPLE / "rayjob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]
    assert spec["entrypoint"].startswith("python examples/ray_cluster/run.py --address auto")
    _flags_exist(spec["entrypoint"])
    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == _pinned_ray()
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["image"] and "rayStartParams" in cluster["headGroupSpec"]
    for group in cluster["workerGroupSpecs"]:
        assert {"groupName", "replicas", "rayStartParams", "template"} <= set(group)
        worker = group["template"]["spec"]["containers"][0]
        assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    gpus = sum(g["replicas"] for g in cluster["workerGroupSpecs"])
    replicas = int(re.search(r"--replicas (\d+)", spec["entrypoint"]).group(1))
    assert gpus == replicas + 1  # one GPU per replica and one for the trainer


def test_the_entry_point_keeps_a_rollout_on_one_replica_and_routes_steps_to_who_has_them():
    from rlcoach.integrations.ray.entry import EntryPoint, ReplicaState

    lost = []
    entry = EntryPoint("127.0.0.1", lost.append)
    for rid in ("a", "b"):
        entry.add(ReplicaState(rid, f"http://{rid}"))
        entry.loaded(rid, "m", 0)
    entry.publish("m", 0)
    first = entry._pick("roll-1", "m")
    first.inflight += 1
    second = entry._pick("roll-2", "m")
    assert {first.replica_id, second.replica_id} == {"a", "b"}  # the least busy first
    assert entry._pick("roll-1", "m@0") is first  # a rollout stays where it started
    entry.loaded("b", "m", 1)  # b has step 1, a is still on step 0
    entry.publish("m", 1)
    assert entry._pick(None, "m@1").replica_id == "b"
    assert entry._pick(None, "m").replica_id == "b"  # plain name: the fleet's latest only
    assert entry._pick(None, "m@0").replica_id in {"a", "b"}
    assert entry._pick(None, "m@7") == "no replica serves 'm@7' now"
    assert entry.mark_lost(first.replica_id) and not entry.mark_lost(first.replica_id)
    assert lost == [first.replica_id]
    assert entry._pick("roll-1", "m@0") == f"lost:{first.replica_id}"  # never half a rollout
    assert [r.replica_id for r in entry.live()] == [second.replica_id]
