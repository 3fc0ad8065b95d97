"""A tiny random-weight Llama and scored groups of random tokens, for trainer tests.

The model is built from its config (hidden 64, two layers, tied embeddings; seeded, so
the same weights every time), so the real trainer code runs on it in about a second.
The groups carry random token ids with rewards that vary within each group, except one
group without variance (the step skips it and counts it).
"""

from __future__ import annotations

import random
from pathlib import Path

from rlcoach import SampledChoice, Trajectory, TrajectoryGroup

VOCAB = 256


def save_tiny_llama(folder: Path) -> Path:
    """Write the tiny Llama's weights and config into `folder` and return it."""
    from tiny_model import save_tiny_model

    return save_tiny_model(folder, vocab_size=VOCAB, hidden_size=64, max_positions=256)


def tiny_groups(seed: int) -> list[TrajectoryGroup]:
    """Four groups of one-call trajectories (prompts of 4-30 tokens, 2-25 sampled ones);
    the third group's rewards are all equal."""
    rng = random.Random(seed)

    def trajectory(reward: float) -> Trajectory:
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(4, 30))]
        sampled = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 25))]
        choice = SampledChoice(
            message={"role": "assistant", "content": "x"},
            prompt_token_ids=prompt,
            token_ids=sampled,
            logprobs=[-rng.uniform(3.0, 8.0) for _ in sampled],
            policy="tiny@0",
        )
        return Trajectory(choices=[choice], reward=reward)

    rewards = [[1.0, 0.0, 0.5, 0.0], [0.2, 0.9, 0.4], [1.0, 1.0, 1.0], [0.0, 1.0]]
    return [TrajectoryGroup(trajectories=[trajectory(r) for r in g]) for g in rewards]
