"""A small MCP server of our own: a shop's inventory, for the examples and tests.

    python -m rlcoach.integrations.mcp.inventory                      # stdio
    python -m rlcoach.integrations.mcp.inventory --transport http --port 8765

Tools: `search_items`, `get_item`, `update_stock`, `create_order` (a nested `customer`
object and an enum `shipping` field) and `list_orders`; a `inventory://catalog` resource
and a `restock_report` prompt. The state lives in the process: over stdio every
session (every rollout) starts from the same catalog; over HTTP, sessions share it.
"""

from __future__ import annotations

import argparse
from typing import Annotated, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

CATALOG = {
    "WID-100": {"name": "blue widget", "category": "widgets", "stock": 42, "price": 2.5},
    "WID-200": {"name": "red widget", "category": "widgets", "stock": 0, "price": 2.75},
    "GAD-300": {"name": "solar gadget", "category": "gadgets", "stock": 7, "price": 19.0},
    "GAD-310": {"name": "pocket gadget", "category": "gadgets", "stock": 15, "price": 12.0},
    "TOL-400": {"name": "steel hammer", "category": "tools", "stock": 23, "price": 9.99},
    "TOL-410": {"name": "long screwdriver", "category": "tools", "stock": 3, "price": 4.5},
}
Category = Literal["widgets", "gadgets", "tools"]


class Customer(BaseModel):
    name: Annotated[str, Field(min_length=1, description="The customer's full name.")]
    email: Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+$", description="Contact e-mail.")]


def build_server() -> MCPServer:
    server = MCPServer(
        "rlcoach-inventory", instructions="A shop's stock and orders.", log_level="WARNING"
    )
    items = {sku: dict(item) for sku, item in CATALOG.items()}
    _add_item_tools(server, items)
    _add_order_tools(server, items, [])
    _add_catalog(server, items)
    return server


def _item_or_error(items: dict[str, dict], sku: str) -> dict:
    item = items.get(sku.strip().upper())
    if item is None:
        raise ToolError(f"no item with SKU {sku!r}; search_items lists the SKUs")
    return item


def _add_item_tools(server: MCPServer, items: dict[str, dict]) -> None:
    """Searching and reading items, and changing their stock."""

    def item_or_error(sku: str) -> dict:
        return _item_or_error(items, sku)

    @server.tool()
    def search_items(
        query: Annotated[str, Field(description="Words of the item's name.")] = "",
        category: Category | None = None,
    ) -> list[dict]:
        """Find items by name and/or category; returns SKU, name, stock and price."""
        words = query.lower().split()
        return [
            {"sku": sku, **item}
            for sku, item in items.items()
            if (category is None or item["category"] == category)
            and all(w in item["name"] for w in words)
        ]

    @server.tool()
    def get_item(sku: Annotated[str, Field(description="The item's SKU, e.g. WID-100.")]) -> dict:
        """The details of one item: name, category, units in stock, unit price."""
        return {"sku": sku.strip().upper(), **item_or_error(sku)}

    @server.tool()
    def update_stock(
        sku: str, change: Annotated[int, Field(description="Units to add (negative to remove).")]
    ) -> dict:
        """Add or remove units of an item; the stock cannot go below zero."""
        item = item_or_error(sku)
        if item["stock"] + change < 0:
            raise ToolError(f"only {item['stock']} units of {sku} in stock")
        item["stock"] += change
        return {"sku": sku.strip().upper(), "stock": item["stock"]}


def _add_order_tools(server: MCPServer, items: dict[str, dict], orders: list[dict]) -> None:
    """Placing orders (out of stock) and listing them."""

    def item_or_error(sku: str) -> dict:
        return _item_or_error(items, sku)

    @server.tool()
    def create_order(
        sku: str,
        quantity: Annotated[int, Field(ge=1)],
        customer: Customer,
        shipping: Literal["standard", "express"] = "standard",
    ) -> dict:
        """Order units of an item for a customer; takes them out of stock."""
        item = item_or_error(sku)
        if item["stock"] < quantity:
            raise ToolError(f"only {item['stock']} units of {sku} in stock")
        item["stock"] -= quantity
        total = round(quantity * item["price"] + (8.0 if shipping == "express" else 0.0), 2)
        order = {
            "order_id": f"ORD-{len(orders) + 1:04d}",
            "sku": sku.strip().upper(),
            "quantity": quantity,
            "customer": customer.model_dump(),
            "shipping": shipping,
            "total": total,
        }
        orders.append(order)
        return order

    @server.tool()
    def list_orders() -> list[dict]:
        """The orders placed since this server started."""
        return list(orders)


def _add_catalog(server: MCPServer, items: dict[str, dict]) -> None:
    """The catalog as a resource, and a prompt about it."""

    @server.resource("inventory://catalog", mime_type="text/plain")
    def catalog() -> str:
        """Every item, one per line."""
        return "\n".join(
            f"{sku}: {i['name']} ({i['category']}), {i['stock']} in stock, ${i['price']}"
            for sku, i in items.items()
        )

    @server.prompt()
    def restock_report(threshold: str = "5") -> str:
        """Ask for a report of the items that need restocking."""
        return (
            f"List every item with fewer than {threshold} units in stock and suggest "
            "how many to order."
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    server = build_server()
    if args.transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host=args.host, port=args.port)


if __name__ == "__main__":
    main()
