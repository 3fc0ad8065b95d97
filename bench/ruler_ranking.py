"""How well a RULER judge ranks trajectories whose true quality is known.

Builds a fixed set of groups from the bundled demo task (attempts by the bundled model
at temperature 1, scored by the task's verifiable reward: 1.0 correct tool call and
answer, 0.5 right call only, 0.2 wrong call, 0.0 no call), keeps the groups whose
members differ in reward, then asks the judge to score every group in each mode and
reports the pairwise ranking accuracy: over all pairs of one group with different true
rewards, the fraction the judge orders the same way (a tie counts one half). The peer is
chance (0.5), so the ratio line is accuracy / 0.5. The judge is the bundled model
through the policy endpoint unless `--judge-url`/`--judge-model` name another
OpenAI-compatible server. Run: `.venv/bin/python bench/ruler_ranking.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
import time

from rlcoach import BUNDLED_MODEL, LocalBackend, Model, TrainableModel, gather_trajectory_groups
from rlcoach.demo.task import RUBRIC, make_questions, run_question
from rlcoach.ruler import JudgeError, JudgeUsage, RulerConfig, score_candidates
from rlcoach.ruler.render import Candidate

MODES = {
    "json": {"mode": "json", "explanation_max_chars": 80},
    "json x3 orderings": {"mode": "json", "explanation_max_chars": 80, "n_orderings": 3},
    "probs": {"mode": "probs"},
    "probs x3 orderings": {"mode": "probs", "n_orderings": 3},
}


def pairwise(true_rewards: list[float], judged: list[float]) -> tuple[float, int]:
    agree, pairs = 0.0, 0
    for i, j in itertools.combinations(range(len(true_rewards)), 2):
        if true_rewards[i] == true_rewards[j]:
            continue
        pairs += 1
        truth = true_rewards[i] > true_rewards[j]
        if judged[i] == judged[j]:
            agree += 0.5
        elif (judged[i] > judged[j]) == truth:
            agree += 1.0
    return agree, pairs


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as root:
        async with LocalBackend(root, engine={"kind": "vllm"}) as backend:
            policy = TrainableModel("policy", "bench")
            await policy.register(backend)
            client = policy.openai_client()
            questions = make_questions(args.questions, seed=7)
            groups = await gather_trajectory_groups(
                [
                    [run_question(policy, client, q) for _ in range(args.attempts)]
                    for q in questions
                ],
                description="sampling attempts",
            )
            fixed = []
            for group in groups:
                # Up to `size` members with distinct rewards first, so every group has pairs.
                by_reward = {}
                for t in group.trajectories:
                    by_reward.setdefault(t.reward, t)
                if len(by_reward) < 2:
                    continue
                chosen = list(by_reward.values())
                chosen += [t for t in group.trajectories if t not in chosen]
                fixed.append(chosen[: args.size])
            print(
                f"groups with mixed rewards: {len(fixed)} of {len(groups)} "
                f"({args.size} members at most)"
            )
            if args.judge_url:
                judge = Model(
                    args.judge_model, base_url=args.judge_url, api_key_env=args.judge_key_env
                )
            else:
                judge = Model(BUNDLED_MODEL, base_url=policy.api_base)
            print(f"judge: {judge.served_name} at {judge.api_base}")
            for label, fields in MODES.items():
                config = RulerConfig(cache_dir=None, **fields)
                usage = JudgeUsage()
                agree, pairs, failed = 0.0, 0, 0
                started = time.perf_counter()
                for members in fixed:
                    try:
                        results = await score_candidates(
                            [Candidate.from_trajectory(t) for t in members],
                            judge,
                            rubric=RUBRIC,
                            config=config,
                            usage=usage,
                        )
                    except JudgeError:
                        failed += 1
                        continue
                    a, p = pairwise([t.reward for t in members], [r.score for r in results])
                    agree, pairs = agree + a, pairs + p
                seconds = time.perf_counter() - started
                accuracy = agree / pairs if pairs else float("nan")
                print(
                    f"  {label:<20} pairwise accuracy {accuracy:.3f} over {pairs} pairs  "
                    f"ratio vs chance {accuracy / 0.5:.2f}  failed groups {failed}  "
                    f"retries {usage.retries}  judge tokens {usage.prompt_tokens}+"
                    f"{usage.completion_tokens}  {seconds / max(len(fixed), 1):.1f} s/group"
                )
            await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=24)
    parser.add_argument("--attempts", type=int, default=8)
    parser.add_argument("--size", type=int, default=4)
    parser.add_argument("--judge-url", default=None)
    parser.add_argument("--judge-model", default=BUNDLED_MODEL)
    parser.add_argument("--judge-key-env", default=None)
    asyncio.run(main(parser.parse_args()))
