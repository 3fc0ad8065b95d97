"""From a one-sentence task description to a trained LoRA: AutoRL inputs, RULER rewards.

    .venv/bin/python examples/autorl_task.py --steps 8
    .venv/bin/python examples/autorl_task.py --task "A travel assistant ..." --generator-url URL \\
        --generator-model NAME --generator-key-env VAR

1. AutoRL generates inputs for the task (deduplicated, with embeddings when the offline
   model is installed), drops those the generator judges unsolvable, writes a system
   prompt, splits train/eval deterministically and saves the dataset (JSONL).
2. GRPO trains on the train split; each group of attempts is scored by RULER (no reward
   function), and the difficulty filter skips inputs whose groups stopped teaching.
3. The held-out split is evaluated before and after: for each eval input, attempts by the
   base weights and by the trained adapter are judged together in one RULER group, and
   the mean judge score of each side is printed (plus how often the trained side won).

With no `--generator-url` the bundled 135M model generates and judges (the base weights,
behind the same policy endpoint): everything runs, but it is a weak generator and judge.
"""

import argparse
import asyncio

from rlcoach import BUNDLED_MODEL, LocalBackend, Model, TrainableModel, gather_trajectory_groups
from rlcoach.autorl import (
    DifficultyFilter,
    GenerationError,
    check_solvable,
    generate_inputs,
    generate_system_prompt,
    save_dataset,
    split_records,
)
from rlcoach.autorl.embeddings import minilm_embedder
from rlcoach.models.usage import ModelUsage
from rlcoach.ruler import RulerConfig, after_each, score_group
from rlcoach.trajectory.dataset import iterate_dataset

TASK = "A calculator assistant: the user asks for the sum of two numbers and gets the sum."


async def attempt(model, client, served_name, system_prompt, record, max_tokens):
    async with model.rollout(input_id=record.id) as rollout:
        await client.chat.completions.create(
            model=served_name,
            max_tokens=max_tokens,
            temperature=1.0,
            messages=[
                {"role": "system", "content": system_prompt},
                {"role": "user", "content": record.text},
            ],
        )
    return rollout.trajectory


async def evaluate(model, client, judge, ruler, rubric, system_prompt, records, args):
    """Mean judge score of base vs trained attempts, judged together per eval input."""
    sides = {"base": f"{model.name}@0", "trained": model.served_name}
    groups = await gather_trajectory_groups(
        [
            [
                attempt(model, client, served, system_prompt, record, args.max_tokens)
                for served in sides.values()
                for _ in range(2)
            ]
            for record in records
        ],
        description="held-out evaluation",
    )
    scores = {"base": [], "trained": []}
    wins = 0
    for group in groups:
        judged = await score_group(group, judge, rubric=rubric, config=ruler)
        by_side = {
            side: [t.reward for t in judged.trajectories if t.policy_versions == [served]]
            for side, served in sides.items()
        }
        for side, values in by_side.items():
            scores[side] += values
        if by_side["base"] and by_side["trained"]:
            wins += sum(by_side["trained"]) > sum(by_side["base"])
    mean = {side: sum(v) / len(v) if v else float("nan") for side, v in scores.items()}
    return mean["base"], mean["trained"], wins / max(len(groups), 1)


async def main(args: argparse.Namespace) -> None:
    model = TrainableModel("autorl-task", "examples", config={"learning_rate": 1e-3})
    async with LocalBackend(args.root, engine={"kind": args.engine}) as backend:
        await model.register(backend)
        local = Model(BUNDLED_MODEL, base_url=model.api_base)
        generator = (
            local
            if not args.generator_url
            else Model(
                args.generator_model,
                base_url=args.generator_url,
                api_key_env=args.generator_key_env,
            )
        )
        usage = ModelUsage()
        try:
            records = await generate_inputs(
                args.task, args.inputs, generator, usage=usage, embed=minilm_embedder()
            )
        except GenerationError as e:
            print(f"warning: {e}")
            records = e.records
        records, rejected = await check_solvable(records, args.task, generator, usage=usage)
        system_prompt = await generate_system_prompt(
            args.task, generator, examples=records, usage=usage
        )
        train, held_out = split_records(records, eval_fraction=0.25, seed=0)
        if not held_out and len(train) > 1:  # tiny runs: keep at least one eval input
            train, held_out = train[:-1], train[-1:]
        if not train or not held_out:
            raise SystemExit(f"only {len(records)} usable inputs; raise --inputs")
        folder = save_dataset(
            backend.paths(model).dir / "dataset",
            train,
            held_out,
            {
                "task": args.task,
                "system_prompt": system_prompt,
                "generator": generator.name,
                "usage": usage.model_dump(),
            },
        )
        print(
            f"dataset: {len(train)} train, {len(held_out)} eval, {len(rejected)} rejected "
            f"as unsolvable, generator {usage.calls} calls -> {folder}"
        )
        print(f"system prompt: {system_prompt[:160]!r}")
        rubric = (
            f"The agent's task: {args.task}\nA trajectory that does this task well, "
            "correctly and concisely, scores higher."
        )
        ruler = RulerConfig(mode="probs", cache_dir=None)
        judge = local
        client = model.openai_client()
        curriculum = DifficultyFilter(window=2)
        for batch in iterate_dataset(train, batch_size=args.inputs_per_step, epochs=100, seed=0):
            if batch.step >= args.steps:
                break
            chosen = curriculum.select(batch.items, key=lambda r: r.id) or batch.items
            groups = await gather_trajectory_groups(
                (
                    [
                        attempt(model, client, model.served_name, system_prompt, r, args.max_tokens)
                        for _ in range(args.group_size)
                    ]
                    for r in chosen
                ),
                after_each=after_each(judge, rubric=rubric, config=ruler),
            )
            report = curriculum.record(groups)
            result = await model.train(groups)
            rewards = [t.reward for g in groups for t in g.trajectories]
            print(
                f"step {batch.step + 1}: judge reward {sum(rewards) / len(rewards):.3f}  "
                f"informative groups {report.informative}/{report.groups}  "
                f"{'trained' if result.stats.trained else 'skipped'}  "
                f"serving {model.served_name}"
            )
        base, trained, win_rate = await evaluate(
            model, client, judge, ruler, rubric, system_prompt, held_out, args
        )
        print(
            f"held-out judge score: base {base:.3f}  trained {trained:.3f}  "
            f"trained won {win_rate:.2f} of {len(held_out)} inputs"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default=TASK)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--inputs", type=int, default=32, help="inputs to generate")
    parser.add_argument("--inputs-per-step", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--engine", default="vllm", choices=["vllm", "transformers"])
    parser.add_argument("--root", default=".rlcoach")
    parser.add_argument("--generator-url", default=None)
    parser.add_argument("--generator-model", default=BUNDLED_MODEL)
    parser.add_argument("--generator-key-env", default=None)
    asyncio.run(main(parser.parse_args()))
