"""A LangGraph app of the shape users write, over a small SQLite shop: a router with
structured output (a JSON schema), a ReAct sub-graph with two tools, a summariser
sub-agent whose prompt does not extend the main conversation, and optionally a chat node
that streams its reply.

Used by `bench/capture_ratio.py` (every path, the router choosing) and by
tests/integration/test_capture_ratio.py (every question to the shop, a tool call forced
first: the 135M model rarely calls a tool on its own). It lives in bench/ because bench/
must not import tests/, and pytest finds it through `pythonpath`.
"""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path
from typing import Any, Literal

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from pydantic import BaseModel

__all__ = ["PRODUCTS", "Route", "ShopState", "build_app", "shop_tools"]

PRODUCTS = [("kettle", 24.5, 13), ("lamp", 18.9, 41)]
"""(name, price in euros, units in stock) of each product in the shop."""


def shop_tools(path: Path) -> list:
    """`lookup_price` and `check_stock` over a SQLite shop at `path` (filled anew)."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE IF NOT EXISTS products (name TEXT, price REAL, stock INTEGER)")
        db.execute("DELETE FROM products")
        db.executemany("INSERT INTO products VALUES (?, ?, ?)", PRODUCTS)

    def find(product: str) -> tuple:
        with sqlite3.connect(path) as db:
            row = db.execute(
                "SELECT price, stock FROM products WHERE name = ?", (product.strip().lower(),)
            ).fetchone()
        if row is None:
            raise ValueError(f"no product named {product!r}")
        return row

    @tool
    def lookup_price(product: Literal["kettle", "lamp"]) -> str:
        """The price of a product in euros."""
        return f"{find(product)[0]:.2f} EUR"

    @tool
    def check_stock(product: Literal["kettle", "lamp"]) -> str:
        """How many units of a product are in stock."""
        return f"{find(product)[1]} units"

    return [lookup_price, check_stock]


class Route(BaseModel):
    destination: Literal["shop", "chat"]


class ShopState(MessagesState):
    route: str
    summary: str


def build_app(
    llm: Any,
    tools: list,
    *,
    router_llm: Any = None,
    force_tool: bool = True,
    chat_node: bool = False,
) -> Any:
    """router (JSON schema, on `router_llm` or `llm`) -> ReAct agent over `tools` ->
    summariser. `force_tool`: the agent's first turn must call a tool (LangChain's `"any"`,
    schema-true arguments), the next answers without tools; otherwise it calls them when
    it chooses. `chat_node`: the router's answer picks the shop or a chat node that
    streams its reply; otherwise every question goes to the shop."""
    with warnings.catch_warnings():  # deprecated for langchain.agents, still widely used
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

    router = (router_llm or llm).with_structured_output(Route)
    if force_tool:

        def pick_model(state: Any, runtime: Any) -> Any:
            if not any(m.type == "tool" for m in state["messages"]):
                return llm.bind_tools(tools, tool_choice="any", strict=True)
            return llm.bind_tools(tools, tool_choice="none")

        agent = create_react_agent(pick_model, tools, prompt="You are the shop assistant.")
    else:
        agent = create_react_agent(
            llm, tools, prompt="You are the shop assistant. Use the tools to answer."
        )
    instruction = "Route shop questions to 'shop'" + (
        ", anything else to 'chat'." if chat_node else "."
    )

    async def route(state: ShopState) -> dict:
        decision = await router.ainvoke([SystemMessage(instruction), state["messages"][-1]])
        return {"route": decision.destination}

    async def chat(state: ShopState) -> dict:
        text = ""
        async for chunk in llm.astream(
            [SystemMessage("You are a friendly assistant."), *state["messages"]]
        ):
            text += chunk.content
        return {"messages": [("assistant", text)]}

    async def summarise(state: ShopState) -> dict:
        transcript = "\n".join(f"{m.type}: {m.content}" for m in state["messages"])
        reply = await llm.ainvoke([HumanMessage(f"Summarise in one line:\n{transcript}")])
        return {"summary": reply.content}

    builder = StateGraph(ShopState)
    builder.add_node("route", route)
    builder.add_node("shop", agent)
    builder.add_node("summarise", summarise)
    builder.add_edge(START, "route")
    if chat_node:
        builder.add_node("chat", chat)
        builder.add_conditional_edges("route", lambda s: s["route"], ["shop", "chat"])
        builder.add_edge("chat", "summarise")
    else:
        builder.add_edge("route", "shop")  # every question is a shop question
    builder.add_edge("shop", "summarise")
    builder.add_edge("summarise", END)
    return builder.compile()
