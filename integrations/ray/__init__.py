"""Ray (`rlcoach.integrations.ray`, extra `[ray]`): rlcoach on a Ray cluster.

`RayBackend` is a `Backend` like `LocalBackend`: the same user code (`model.register`,
`model.rollout()`, `gather_trajectory_groups`, `model.train`) runs with inference
replicas, the trainer and rollout workers placed by Ray (docs/scale-out.md).

    from rlcoach.integrations.ray import RayBackend
    backend = RayBackend({"address": "auto", "replicas": 2, "replica": {"num_gpus": 1}})

Importing this package does not import Ray; `RayBackend` does when it joins the cluster
(and says which extra to install if it is missing).
"""

from rlcoach.integrations.ray.backend import RayBackend
from rlcoach.integrations.ray.config import RayConfig, Resources
from rlcoach.integrations.ray.entry import EntryPoint
from rlcoach.integrations.ray.rollouts import EntryClient, ReplicaLostError

__all__ = ["EntryClient", "EntryPoint", "RayBackend", "RayConfig", "ReplicaLostError", "Resources"]
