"""The first on-policy step's sampler/trainer ratio on every capture path, per kind of call.

    flock /tmp/rlcoach-cpu.lock .venv/bin/python bench/capture_ratio.py --runs 6

On-policy, the trainer's log-prob of each sampled token must equal the one the engine
reported, so exp(new - old) is 1 up to numerics. This script starts the real vLLM engine
behind the policy endpoint and samples through every capture path:

- a LangGraph app of the shape users write (bench/shop_app.py): a router node with
  `with_structured_output` (JSON schema), a `create_react_agent` sub-graph over two
  SQLite tools, a summariser sub-agent whose prompt does not extend the main
  conversation, and a streamed reply;
- the plain OpenAI client (chat, tools offered, a forced tool choice, JSON schema, regex,
  streamed).

It then computes the trainer's log-probs of every sampled token (the step's own LoRA
model, adapter at its zero start, the step's autocast) and prints, per kind of call, the
tokens, the mean ratio, the mean and max |delta log-prob| and the forced tokens; then one
real training step on all of it and the step's own `mean_ratio`. `--dump` saves the
trajectories; `--load` reports on saved ones without starting an engine.
"""

import argparse
import asyncio
import json
import math
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from shop_app import PRODUCTS, Route, build_app, shop_tools  # bench/shop_app.py

from rlcoach import LocalBackend, TrainableModel, TrajectoryGroup, load_groups, save_groups
from rlcoach.integrations.langgraph import chat_model, rollout_fn
from rlcoach.trainer.sequences import TrainSequence, pack_sequences

REGEX = "(yes|no), [a-z ]{3,20}"


def kind_of(history, choice) -> str:
    first = history.messages[0]
    text = str(first.get("content"))
    if text.startswith("Route shop"):
        return "langgraph: router (JSON schema)"
    if text.startswith("Summarise"):
        return "langgraph: summariser sub-agent"
    if text.startswith("You are a friendly"):
        return "langgraph: chat node (streamed)"
    if text.startswith("You are the shop"):
        if choice.message.get("tool_calls"):
            return "langgraph: ReAct tool call"
        return "langgraph: ReAct reply"
    return str(history.messages[0].get("name") or "other")


async def openai_paths(policy, runs: int) -> list:
    """Trajectories from the plain OpenAI client, one kind per trajectory (in `name`)."""
    client = policy.openai_client()
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup_price",
                "description": "The price of a product in euros.",
                "parameters": {
                    "type": "object",
                    "properties": {"product": {"type": "string"}},
                    "required": ["product"],
                },
            },
        }
    ]
    schema = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": Route.model_json_schema()},
    }
    kinds = {
        "openai: plain chat": {},
        "openai: tools offered (auto)": {"tools": tools},
        "openai: JSON schema": {"response_format": schema},
        "openai: regex": {"extra_body": {"structured_outputs": {"regex": REGEX}}},
        "openai: tool_choice required": {"tools": tools, "tool_choice": "required"},
    }
    out = []
    for name, options in kinds.items():
        for index in range(runs):
            async with policy.rollout(kind=name) as scope:
                messages = [
                    {"role": "system", "content": "Answer briefly.", "name": name},
                    {
                        "role": "user",
                        "content": f"Is a {PRODUCTS[index % len(PRODUCTS)][0]} expensive?",
                    },
                ]
                try:
                    await client.chat.completions.create(
                        model=policy.name, messages=messages, max_tokens=32, **options
                    )
                except Exception as e:  # a refused path is a finding, not a crash
                    print(f"{name}: refused: {str(e)[:160]}")
                    break
            out.append(scope.trajectory)
        async with policy.rollout(kind="openai: streamed") as scope:
            stream = await client.chat.completions.create(
                model=policy.name,
                messages=[
                    {"role": "system", "content": "Answer briefly.", "name": "openai: streamed"},
                    {"role": "user", "content": "Name a kitchen appliance."},
                ],
                max_tokens=32,
                stream=True,
            )
            async for _ in stream:
                pass
        out.append(scope.trajectory)
    return out


def trainer_logprobs(trainer, choice) -> list[float]:
    ids = [*choice.prompt_token_ids, *choice.token_ids]
    mask = [0] * len(choice.prompt_token_ids) + [1] * len(choice.token_ids)
    sequence = TrainSequence(ids, mask, [0.0] * len(ids), 0.0, "x")
    [row] = pack_sequences([sequence], max_tokens=len(ids))
    with torch.no_grad():
        new_T = trainer.row_logprobs(row).float()
    start = len(choice.prompt_token_ids) - 1
    return new_T[start : start + len(choice.token_ids)].tolist()


def report(trainer, trajectories) -> None:
    per_kind: dict[str, list[tuple[float, float, bool]]] = defaultdict(list)
    for trajectory in trajectories:
        for history in trajectory.histories():
            for choice in history.choices:
                kind = kind_of(history, choice)
                forced = [0] * len(choice.token_ids)
                for position in getattr(choice, "forced", None) or []:
                    forced[position] = 1
                new = trainer_logprobs(trainer, choice)
                for old, value, f in zip(choice.logprobs, new, forced, strict=True):
                    per_kind[kind].append((old, value, bool(f)))
    head = f"{'kind of call':40} {'tokens':>6} {'forced':>6} {'ratio':>7} {'free':>7} "
    print(head + f"{'mean|d|':>8} {'max|d|':>7}")
    for kind, rows in sorted(per_kind.items()):
        deltas = [new - old for old, new, _ in rows]
        free = [new - old for old, new, f in rows if not f]
        forced = sum(f for _, _, f in rows)
        ratio = sum(math.exp(d) for d in deltas) / len(deltas)
        free_ratio = sum(math.exp(d) for d in free) / len(free) if free else float("nan")
        print(
            f"{kind:40} {len(rows):6d} {forced:6d} {ratio:7.3f} {free_ratio:7.3f} "
            f"{sum(abs(d) for d in deltas) / len(deltas):8.3f} {max(abs(d) for d in deltas):7.3f}"
        )


def offline(args: argparse.Namespace) -> None:
    """The report and one step on trajectories saved by an earlier run (`--dump`): the
    LoRA trainer at its zero start is the policy that sampled them at step 0."""
    from rlcoach.config import TrainConfig
    from rlcoach.models.bundled import bundled_model_path
    from rlcoach.trainer.lora import LoraTrainer

    [group] = load_groups(args.load)
    trainer = LoraTrainer(bundled_model_path(), TrainConfig(learning_rate=1e-4))
    report(trainer, group.trajectories)
    for index, trajectory in enumerate(group.trajectories):
        trajectory.reward = float(index % 2)
    stats = trainer.step([group]).as_dict()
    print(json.dumps({k: v for k, v in stats.items() if not isinstance(v, dict)}))


async def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="capture-ratio-"))
    async with LocalBackend(root, engine={"kind": "vllm"}) as backend:
        policy = TrainableModel("ratio", "bench", config={"learning_rate": 1e-4})
        await policy.register(backend)
        llm = chat_model(policy, max_tokens=args.max_tokens)
        app = build_app(llm, shop_tools(root / "shop.db"), force_tool=False, chat_node=True)

        @rollout_fn(policy)
        async def attempt(scope, question: str):
            state = await app.ainvoke({"messages": [("user", question)]})
            scope.record_state(state)

        questions = [
            "How much is the kettle?",
            "Is the lamp in stock?",
            "Tell me a joke about kettles.",
        ]
        graph_runs = [await attempt(questions[i % len(questions)]) for i in range(args.runs)]
        for t in graph_runs[:3]:
            main_first = t.messages[0].get("content") if t.messages else None
            print(
                f"main history starts {str(main_first)[:40]!r}, {len(t.choices)} choices, "
                f"{len(t.additional_histories)} more; logs: {t.logs}"
            )
        plain = await openai_paths(policy, args.runs)
        everything = graph_runs + plain
        if args.dump:
            save_groups(args.dump, [TrajectoryGroup(everything)])
        trainer = backend._trainer(policy)
        report(trainer, everything)
        for index, trajectory in enumerate(everything):
            trajectory.reward = float(index % 2)
        result = await policy.train([TrajectoryGroup(everything)])
        stats = result.stats.as_dict()
        print(json.dumps({k: v for k, v in stats.items() if not isinstance(v, dict)}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--dump", default=None, help="write the trajectories here (JSONL)")
    parser.add_argument("--load", default=None, help="no engine: report on a --dump file")
    arguments = parser.parse_args()
    if arguments.load:
        offline(arguments)
    else:
        asyncio.run(main(arguments))
