"""The tools of the forced-call measurements and tests: one set, shared by
bench/forced_calls.py, tests/integration/test_forced_calls.py and
tests/integration/test_capture_ratio.py (tests import it; it imports nothing of theirs).

Five tools covering what a schema asks of a call: integers (`add`); a free-text string,
an enum and an optional nested object (`get_weather`); a nested required object and an
open array of strings (`create_event`); optional integers, an enum, a string and a nested
object with a required key (`set_alarm`); a string, an enum, an optional number and a
boolean (`search_products`).
"""

from typing import Any

__all__ = ["QUESTIONS", "SCHEMAS", "TOOLS", "tool"]

TOOLS: list[dict[str, Any]] = [
    {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
    {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "detail": {
                    "type": "object",
                    "properties": {"hourly": {"type": "boolean"}, "days": {"type": "integer"}},
                    "required": ["days"],
                },
            },
            "required": ["city"],
        },
    },
    {
        "name": "create_event",
        "description": "Put an event in the calendar.",
        "parameters": {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "when": {
                    "type": "object",
                    "properties": {
                        "date": {"type": "string"},
                        "hour": {"type": "integer", "minimum": 0, "maximum": 23},
                    },
                    "required": ["date", "hour"],
                },
                "attendees": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["title", "when"],
        },
    },
    {
        "name": "set_alarm",
        "description": "Set an alarm.",
        "parameters": {
            "type": "object",
            "properties": {
                "hour": {"type": "integer"},
                "minute": {"type": "integer"},
                "repeat": {"type": "string", "enum": ["once", "daily", "weekdays"]},
                "snooze": {
                    "type": "object",
                    "properties": {"minutes": {"type": "integer"}, "times": {"type": "integer"}},
                    "required": ["minutes"],
                },
                "label": {"type": "string"},
            },
            "required": ["hour"],
        },
    },
    {
        "name": "search_products",
        "description": "Search the shop's products.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "category": {"type": "string", "enum": ["kitchen", "garden", "toys"]},
                "max_price": {"type": "number"},
                "in_stock": {"type": "boolean"},
            },
            "required": ["query", "category"],
        },
    },
]
"""Each tool's `function` object (name, description, parameters)."""

SCHEMAS: dict[str, dict[str, Any]] = {t["name"]: t["parameters"] for t in TOOLS}
"""Each tool's parameters schema, by name."""

QUESTIONS = {
    "add": ["What is 2 + 3?", "Add 17 and 25.", "What is 120 plus 7?", "Sum 4 and 9."],
    "get_weather": [
        "What's the weather in Lisbon?",
        "Is it cold in Oslo right now, in fahrenheit?",
        "Weather for Tokyo for the next 3 days, please.",
        "How warm is it in Cairo?",
    ],
    "create_event": [
        "Book a dentist appointment on 2026-12-09 at 10.",
        "Add lunch with Ana and Rui on 2026-12-11 at 13.",
        "Schedule a team sync tomorrow at 9.",
        "Put 'call mum' in my calendar on Friday at 18.",
    ],
    "set_alarm": [
        "Wake me up at 6:30.",
        "Set an alarm for 7 every day.",
        "Alarm at 22:15 labelled 'pills', snooze 5 minutes.",
        "Remind me at noon on weekdays.",
    ],
    "search_products": [
        "Find a kettle under 40 euros.",
        "Do you have garden hoses in stock?",
        "Show me toy cars.",
        "I need a cheap frying pan.",
    ],
}
"""Four user questions for each tool."""


def tool(name: str, *, strict: bool = False) -> dict[str, Any]:
    """The OpenAI `tools` entry of tool `name` (marked `strict` when asked)."""
    [function] = [t for t in TOOLS if t["name"] == name]
    return {"type": "function", "function": {**function, **({"strict": True} if strict else {})}}
