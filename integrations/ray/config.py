"""What a Ray run asks of the cluster: where the cluster is, how many inference replicas,
and the resources of a replica, of the trainer and of a rollout worker.

Each replica and the trainer get a placement group of their own (one bundle each, the
resources below), so Ray puts them where the cluster has room and a replica lost with
its node is replaced by a new group wherever room appears. `resources` are Ray's custom
node resources (`ray start --resources='{"replica": 1}'`): the way to pin a role to a
kind of node.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rlcoach.config import Config, EngineConfig

__all__ = ["RayConfig", "Resources"]


class Resources(Config):
    """What one actor or task asks of a Ray node."""

    num_cpus: float = Field(1.0, ge=0.0)
    num_gpus: float = Field(0.0, ge=0.0)
    memory_gib: float = Field(0.0, ge=0.0)
    """Ray's `memory` resource in GiB (0: not asked)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom node resources, e.g. `{"replica": 1}`."""

    def bundle(self) -> dict[str, float]:
        """The placement-group bundle: Ray's names for these resources, zeros left out."""
        bundle = {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.resources}
        if self.memory_gib:
            bundle["memory"] = self.memory_gib * 2**30
        return {k: v for k, v in bundle.items() if v}

    def options(self) -> dict[str, Any]:
        """`.options(...)` for a task or actor outside a placement group."""
        out: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.memory_gib:
            out["memory"] = self.memory_gib * 2**30
        if self.resources:
            out["resources"] = dict(self.resources)
        return out


class RayConfig(Config):
    """A Ray run: the cluster, the inference replicas, the trainer and rollout workers."""

    address: str | None = None
    """`ray.init(address=...)`: "auto" (a cluster started on this node), "host:port" of
    the head's GCS, or None: the cluster this process already joined, else a new local one."""
    replicas: int = Field(2, ge=1, le=1024)
    """Inference replicas (an engine and a policy endpoint each)."""
    engine: EngineConfig = Field(default_factory=EngineConfig)
    """Each replica's engine (vLLM on GPUs; the transformers engine serves on CPUs)."""
    replica: Resources = Field(default_factory=lambda: Resources(num_cpus=1, num_gpus=0))
    trainer: Resources = Field(default_factory=lambda: Resources(num_cpus=1, num_gpus=0))
    rollout_worker: Resources = Field(default_factory=lambda: Resources(num_cpus=0.25))
    """One rollout task (the user's rollout function): light, it mostly waits on the policy."""
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "STRICT_PACK"
    """Placement strategy of each replica's group (one bundle: STRICT_PACK keeps a
    multi-GPU bundle on one node)."""
    entry_host: str = "127.0.0.1"
    """Where the one OpenAI-compatible entry point listens (0.0.0.0 for workers on other
    nodes); replicas listen on `engine.host` likewise."""
    startup_timeout_s: float = Field(600.0, gt=0.0)
    """Longest wait for the placement groups and the replicas' engines at registration."""
    max_rollout_attempts: int = Field(3, ge=1)
    """Runs of one rollout when its replica or worker is lost (each retry is counted)."""
