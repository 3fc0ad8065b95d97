"""Training across a Ray cluster: inference replicas, rollout workers and the trainer
placed by Ray (docs/scale-out.md).

On one machine, a local multi-node cluster (a head and two replica nodes, started by this
script and shut down at its end) and a short run on the CPU:

    .venv/bin/python examples/ray_cluster/run.py --local-nodes 2 --steps 3

On a real cluster (`ray start --head` and workers, SkyPilot or KubeRay: see
examples/ray_cluster/skypilot.yaml and rayjob.yaml), one GPU per replica and one for
the trainer, vLLM in each replica:

    python examples/ray_cluster/run.py --address auto --replicas 4 --gpus \\
        --base-model Qwen/Qwen3-0.6B --steps 50
"""

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path

from rlcoach import TrainableModel, gather_trajectory_groups
from rlcoach.integrations.ray import RayBackend

QUESTIONS = [
    "In one word: name a colour.",
    "In one word: what is 2+2?",
    "In one word: name an animal.",
    "In one word: say hello.",
]
MAX_TOKENS = 32


async def short_answer(model, question):
    """One rollout, run in a Ray task: short replies get the higher reward."""
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


def config(args):
    if args.gpus:
        return {
            "address": args.address,
            "replicas": args.replicas,
            "engine": {"kind": "vllm", "host": "0.0.0.0"},
            "entry_host": "0.0.0.0",
            "replica": {"num_cpus": 4, "num_gpus": 1},
            "trainer": {"num_cpus": 4, "num_gpus": 1},
        }
    return {
        "address": args.address,
        "replicas": args.replicas,
        "engine": {"kind": "transformers", "max_model_len": 512},
        "replica": {"num_cpus": 1, "resources": {"replica": 1}},
        "trainer": {"num_cpus": 1, "resources": {"trainer": 1}},
    }


async def main(args):
    model = TrainableModel(
        "short", "ray-example", args.base_model, config={"learning_rate": args.learning_rate}
    )
    async with RayBackend(config(args), root=args.root) as backend:
        await model.register(backend)
        rollout = backend.remote(short_answer)
        for _ in range(args.steps):
            groups = await gather_trajectory_groups(
                [[rollout(model, q) for _ in range(args.group_size)] for q in QUESTIONS[:2]],
                progress=False,
            )
            rewards = [r for g in groups for r in g.rewards]
            result = await model.train(groups)
            print(
                f"step {result.step}: mean reward {sum(rewards) / len(rewards):.3f} over "
                f"{len(rewards)} trajectories, {result.metrics['rollouts_retried']:.0f} "
                f"retried, {result.metrics['replicas']:.0f} replicas"
            )


@contextlib.contextmanager
def local_nodes(count):
    """A head (the trainer's node) and `count` replica nodes on this machine."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from ray_task import local_cluster

    with local_cluster(count) as cluster:
        yield cluster


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=None, help="Ray cluster: auto, host:port")
    parser.add_argument("--local-nodes", type=int, default=0, help="start a local cluster")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--gpus", action="store_true", help="vLLM replicas on one GPU each")
    parser.add_argument("--base-model", default="smollm2-135m-instruct")
    parser.add_argument("--learning-rate", type=float, default=1e-2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--root", default=".rlcoach")
    args = parser.parse_args()
    with local_nodes(args.local_nodes) if args.local_nodes else contextlib.nullcontext():
        asyncio.run(main(args))
