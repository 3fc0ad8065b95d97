"""Train an ordinary LangGraph ReAct agent over a SQLite shop database.

    .venv/bin/python examples/langgraph_sqlite.py --steps 8
    .venv/bin/python examples/langgraph_sqlite.py --generator-url URL --generator-model NAME \\
        --generator-key-env VAR        # a stronger model writes the training questions

The agent (`build_agent` below) is plain LangGraph: a `StateGraph` with an agent node,
a `ToolNode` over two SQLite tools and `tools_condition`, exactly as a user writes it.
What rlcoach adds is outside it: the graph is built with `chat_model(policy)` and each
run sits in a `rollout(policy)` scope, so every LLM call it makes is captured (exact
tokens) and trained.

1. AutoRL writes training questions from the graph's own tools and a listing of the
   shop's training products (`generate_scenarios`); those naming no shop product are
   dropped and the rest of the set is filled from templates (see `training_questions`).
2. GRPO trains on them; each group of attempts is scored by RULER (no reward function):
   the bundled base model judges the attempts against a rubric, in `probs` mode.
3. Held-out success is measured before and after on templated questions about products
   that training never mentions, with known answers: the agent must call the right tool
   and state the value it returned.

With no `--generator-url` the bundled 135M model writes the questions and judges (the
base weights, behind the same policy endpoint): everything runs, but it is a weak
generator and judge.
"""

import argparse
import asyncio
import random
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.errors import GraphRecursionError
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from rlcoach import BUNDLED_MODEL, LocalBackend, Model, TrainableModel, gather_trajectory_groups
from rlcoach.autorl import GenerationError, InputRecord, generate_scenarios
from rlcoach.integrations.langgraph import chat_model, rollout
from rlcoach.ruler import after_each, judge_usage
from rlcoach.trajectory.dataset import iterate_dataset

# name, price in euros, units in stock. The first 16 are what training may ask about;
# the last 8 are held out (only the evaluation asks about them).
PRODUCTS = [
    ("kettle", 24.50, 13),
    ("desk lamp", 18.90, 41),
    ("toaster", 31.20, 17),
    ("blender", 57.40, 26),
    ("coffee grinder", 42.10, 38),
    ("rice cooker", 64.80, 12),
    ("hair dryer", 27.30, 53),
    ("steam iron", 35.60, 29),
    ("fan heater", 46.70, 16),
    ("wall clock", 15.40, 72),
    ("bath towel", 11.80, 64),
    ("frying pan", 29.90, 35),
    ("cutting board", 13.70, 48),
    ("water filter", 22.60, 57),
    ("bike lock", 19.30, 23),
    ("yoga mat", 25.10, 31),
    ("alarm clock", 16.20, 44),
    ("table fan", 38.50, 19),
    ("bread knife", 21.40, 67),
    ("salad bowl", 14.90, 36),
    ("pillow", 17.60, 82),
    ("lunch box", 12.30, 58),
    ("dish rack", 23.80, 27),
    ("door mat", 10.70, 91),
]
TRAINING_PRODUCTS = PRODUCTS[:16]
HELD_OUT_PRODUCTS = PRODUCTS[16:]


# --- the user's app: nothing below knows about rlcoach ---------------------------------


def create_shop(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE IF EXISTS products")
        db.execute("CREATE TABLE products (name TEXT PRIMARY KEY, price REAL, stock INTEGER)")
        db.executemany("INSERT INTO products VALUES (?, ?, ?)", PRODUCTS)


def shop_tools(path: Path) -> list:
    def find(product: str) -> tuple[float, int]:
        with sqlite3.connect(path) as db:
            row = db.execute(
                "SELECT price, stock FROM products WHERE name = ?", (product.strip().lower(),)
            ).fetchone()
        if row is None:
            raise ValueError(f"no product named {product!r}")
        return row

    @tool
    def lookup_price(product: str) -> str:
        """The price of a product in euros."""
        return f"{find(product)[0]:.2f} EUR"

    @tool
    def check_stock(product: str) -> str:
        """How many units of a product are in stock."""
        return f"{find(product)[1]} units"

    return [lookup_price, check_stock]


SYSTEM = (
    "You are the shop's assistant. Use lookup_price for prices and check_stock for "
    "stock, then answer in one short sentence with the number the tool gave."
)


def _worked(question: str, tool_name: str, product: str, result: str, answer: str, n: int):
    call = {"name": tool_name, "args": {"product": product}, "id": f"call_{n}"}
    return [
        HumanMessage(question),
        AIMessage("", tool_calls=[call]),
        ToolMessage(result, tool_call_id=f"call_{n}"),
        AIMessage(answer),
    ]


EXAMPLES = [
    *_worked(
        "How much does the sofa cost?",
        "lookup_price",
        "sofa",
        "249.00 EUR",
        "The sofa costs 249.00 EUR.",
        0,
    ),
    *_worked(
        "How many units of mirror do you have in stock?",
        "check_stock",
        "mirror",
        "7 units",
        "We have 7 units of mirror in stock.",
        1,
    ),
    *_worked(
        "What is the price of the garden hose?",
        "lookup_price",
        "garden hose",
        "33.40 EUR",
        "The garden hose costs 33.40 EUR.",
        2,
    ),
    *_worked(
        "Do you still have the office chair in stock?",
        "check_stock",
        "office chair",
        "52 units",
        "Yes, we have 52 units of office chair in stock.",
        3,
    ),
]


def build_agent(llm, tools):
    """A ReAct agent: the model calls tools until it answers."""
    model = llm.bind_tools(tools)

    async def agent(state: MessagesState):
        reply = await model.ainvoke([SystemMessage(SYSTEM), *EXAMPLES, *state["messages"]])
        return {"messages": [reply]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(tools, handle_tool_errors=True))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile()


# --- training it ---------------------------------------------------------------------

RUBRIC = """\
The user asks a shop assistant about a product; the assistant has tools that look up \
prices and stock in the shop's database.
- Best: it calls the right tool for the right product, then answers with the number the \
tool returned, in one short sentence.
- Worse: it calls a tool but answers with a different number, or not at all.
- Worse still: it calls the wrong tool or asks about another product.
- Worst: it answers with a number it made up, without calling a tool."""


@dataclass(frozen=True, slots=True)
class Check:
    """A held-out question with its known answer."""

    product: str
    tool: str
    value: str

    @property
    def text(self) -> str:
        if self.tool == "lookup_price":
            return f"How much does the {self.product} cost?"
        return f"How many units of {self.product} do you have in stock?"

    def passed(self, messages) -> bool:
        calls = [call for m in messages for call in getattr(m, "tool_calls", None) or []]
        called = any(
            call["name"] == self.tool
            and str(call["args"].get("product", "")).lower() == self.product
            for call in calls
        )
        final = messages[-1]
        return called and final.type == "ai" and self.value in str(final.content)


def held_out_checks() -> list[Check]:
    return [
        check
        for name, price, stock in HELD_OUT_PRODUCTS
        for check in (
            Check(name, "lookup_price", f"{price:.2f}"),
            Check(name, "check_stock", str(stock)),
        )
    ]


async def attempt(policy, graph, text: str, check: Check | None = None, **metadata):
    """One run of the graph in a rollout scope; its trajectory holds every policy call."""
    async with rollout(policy, **metadata) as scope:
        try:
            state = await graph.ainvoke(
                {"messages": [("user", text)]}, config={"recursion_limit": 8}
            )
        except GraphRecursionError:  # still a trajectory: the calls it made are recorded
            scope.metrics["cut_off"] = 1.0
            state = None
        if state is not None:
            scope.record_state(state)
        if check is not None:
            scope.metrics["success"] = float(state is not None and check.passed(state["messages"]))
    return scope.trajectory


async def evaluate(policy, graph, checks: list[Check], samples: int, when: str) -> float:
    """Held-out success (a failed run counts as a miss); prints how often tools were used."""
    groups = await gather_trajectory_groups(
        [
            [
                attempt(policy, graph, c.text, c, product=c.product, tool=c.tool)
                for _ in range(samples)
            ]
            for c in checks
        ],
        description="held-out evaluation",
    )
    runs = [t for g in groups for t in g.trajectories]
    total = max(len(checks) * samples, 1)
    success = sum(t.metrics.get("success", 0.0) for t in runs) / total
    called = sum(t.metrics.get("tool_calls", 0.0) > 0 for t in runs)
    print(
        f"held-out success {when} training: {success:.3f}  ({called} of {total} runs called a tool)"
    )
    return success


TEMPLATES = [
    "How much does the {} cost?",
    "What is the price of the {}?",
    "How many units of {} are in stock?",
    "Do you still have the {} in stock?",
]


async def training_questions(args, tools, generator: Model) -> list[InputRecord]:
    """AutoRL's questions that name a training product, topped up from templates.

    A question about no product in the shop cannot be answered from it, so those are
    dropped; a weak generator (the bundled 135M model) writes few that survive, and the
    rest of `--questions` is filled from templates over the training products.
    """
    names = [name for name, _, _ in TRAINING_PRODUCTS]
    listing = "\n".join(f"- {name}" for name in names)
    try:
        records = await generate_scenarios(
            [convert_to_openai_tool(t) for t in tools],
            args.questions,
            generator,
            resources=f"The shop's products:\n{listing}",
        )
    except GenerationError as e:
        print(f"warning: {e}")
        records = e.records
    kept = [r for r in records if any(name in r.text.lower() for name in names)]
    filler = [
        InputRecord(text=t.format(name), metadata={"source": "template"})
        for name in names
        for t in TEMPLATES
    ]
    random.Random(0).shuffle(filler)
    print(
        f"AutoRL wrote {len(records)} questions, {len(kept)} about a shop product "
        f"(e.g. {records[0].text[:80]!r})"
        if records
        else "AutoRL wrote no questions"
    )
    return kept + filler[: max(args.questions - len(kept), 0)]


async def main(args: argparse.Namespace) -> None:
    policy = TrainableModel("shop-agent", "examples", config={"learning_rate": 1e-3})
    async with LocalBackend(args.root, engine={"kind": args.engine}) as backend:
        await policy.register(backend)
        shop = backend.paths(policy).dir / "shop.db"
        create_shop(shop)
        tools = shop_tools(shop)
        # The user's graph, built once with the policy's chat model; the plain model name
        # is routed to the newest LoRA, so it samples from every new step unchanged.
        graph = build_agent(chat_model(policy, max_tokens=args.max_tokens), tools)
        local = Model(BUNDLED_MODEL, base_url=policy.api_base)  # the base weights
        generator = (
            local
            if not args.generator_url
            else Model(
                args.generator_model,
                base_url=args.generator_url,
                api_key_env=args.generator_key_env,
            )
        )
        records = await training_questions(args, tools, generator)
        checks = held_out_checks()[: args.eval_questions]
        before = await evaluate(policy, graph, checks, args.eval_samples, "before")
        judge = after_each(local, rubric=RUBRIC, config={"mode": "probs", "cache_dir": None})
        for batch in iterate_dataset(
            records,
            batch_size=args.questions_per_step,
            epochs=100,
            seed=0,
            initial_step=policy.step,
        ):
            if batch.step >= args.steps:
                break
            groups = await gather_trajectory_groups(
                (
                    [attempt(policy, graph, r.text, input_id=r.id) for _ in range(args.group_size)]
                    for r in batch.items
                ),
                after_each=judge,
            )
            runs = [t for g in groups for t in g.trajectories]
            reward = sum(t.reward for t in runs) / max(len(runs), 1)
            calls = sum(t.metrics.get("tool_calls", 0.0) for t in runs) / max(len(runs), 1)
            errors = sum(t.metrics.get("tool_errors", 0.0) for t in runs)
            result = await policy.train(groups)
            print(
                f"step {batch.step + 1}: judge reward {reward:.3f}  tool calls per run "
                f"{calls:.2f}  tool errors {errors:.0f}  judge failed groups "
                f"{judge_usage(groups)['ruler_failed_groups']:.0f}  "
                f"{'trained' if result.stats.trained else 'skipped'}  "
                f"serving {policy.served_name}"
            )
        after = await evaluate(policy, graph, checks, args.eval_samples, "after")
        print(f"result: success_before={before:.3f} success_after={after:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--questions", type=int, default=24, help="questions AutoRL writes")
    parser.add_argument("--questions-per-step", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=6)
    parser.add_argument("--eval-questions", type=int, default=16)
    parser.add_argument("--eval-samples", type=int, default=2, help="attempts per question")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--engine", default="vllm", choices=["vllm", "transformers"])
    parser.add_argument("--root", default=".rlcoach")
    parser.add_argument("--generator-url", default=None)
    parser.add_argument("--generator-model", default=BUNDLED_MODEL)
    parser.add_argument("--generator-key-env", default=None)
    asyncio.run(main(parser.parse_args()))
