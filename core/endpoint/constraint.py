"""Sampling constraints: which requests the engine samples under a grammar, and what it forced.

A JSON schema (`response_format`), a regex or choice list (vLLM's `structured_outputs`),
a forced tool choice (`tool_choice="required"`, a named tool, LangChain's `"any"`) or a
tool marked `strict` make vLLM mask the logits with a grammar before sampling (for a
forced tool choice, the endpoint's own grammar of the family's call envelope,
call_grammar.py). Two things follow for training, and the policy endpoint handles both:

- vLLM computes its reported log-probs after the mask, so a constrained token's log-prob
  is the policy's renormalised over what the grammar allowed — higher than the model's
  own, which is what the trainer recomputes. Training on it reads as an off-policy ratio
  well below 1 (the 0.92 of issue 24). The endpoint re-scores a constrained completion
  without the grammar (`Engine.token_logprobs`) and records those log-probs instead.
- Where the grammar allowed one token only (the braces and keys of a JSON schema, the
  envelope of a forced tool call, the end of turn after a closed object), the policy
  chose nothing: the position is recorded as forced and kept out of the loss. The
  endpoint asks for the two most likely tokens at each position of a constrained
  completion: a runner-up at vLLM's -inf floor (-9999) means nothing else was allowed.

Free requests are untouched: no re-scoring, no extra log-probs.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "FORCED_FLOOR",
    "GUIDED_KINDS",
    "STRUCTURED_KINDS",
    "TOOL_CHOICES",
    "as_asked",
    "forced_positions",
    "normalize_tool_choice",
    "sampling_constraint",
    "strict_tools",
    "tool_choice_problem",
    "unknown_tool_problem",
]

FORCED_FLOOR = -9999.0
"""vLLM clamps a log-prob of -inf (a token the grammar masked) to this value."""

TOOL_CHOICES = ("auto", "none", "required", "any")
"""The string values of `tool_choice` the policy endpoint accepts ("any" is LangChain's
and Anthropic's name for "required")."""

STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
"""The constraints vLLM's `structured_outputs` can carry (the rest of it are options)."""
GUIDED_KINDS = ("json", "regex", "choice", "grammar")
"""vLLM's older request fields for a constraint, `guided_<kind>`."""


def normalize_tool_choice(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with `tool_choice="any"` spelled as OpenAI's `"required"`."""
    if body.get("tool_choice") == "any":
        return {**body, "tool_choice": "required"}
    return body


def tool_choice_problem(choice: Any) -> str | None:
    """What is wrong with a `tool_choice` value, or None."""
    if choice is None or choice in TOOL_CHOICES:
        return None
    if isinstance(choice, dict):
        function = choice.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return None
    return (
        f"`tool_choice`={choice!r} is not one of 'auto', 'none', 'required', 'any' or "
        "{'type': 'function', 'function': {'name': ...}}; fix: use one of those"
    )


def unknown_tool_problem(body: dict[str, Any]) -> str | None:
    """What is wrong with a named `tool_choice` whose tool is not in `tools`, or None."""
    choice = body.get("tool_choice")
    if not isinstance(choice, dict):
        return None
    name = (choice.get("function") or {}).get("name")
    tools = body.get("tools")
    names = [
        (tool.get("function") or {}).get("name")
        for tool in (tools if isinstance(tools, list) else [])
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict)
    ]
    if name in names:
        return None
    offered = ", ".join(repr(n) for n in names) or "none"
    return (
        f"`tool_choice` names the tool {name!r}, which is not in `tools` (offered: {offered}); "
        "fix: add the tool to `tools` or name one of them"
    )


def strict_tools(body: dict[str, Any]) -> list[tuple[str, Any]]:
    """(name, parameters) of each tool marked `strict` in a request that may call tools."""
    if body.get("tool_choice") == "none":
        return []
    found = []
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else []:
        if _strict(tool) and isinstance(tool.get("function"), dict):
            function = tool.get("function") or {}
            found.append((str(function.get("name")), function.get("parameters")))
    return found


def sampling_constraint(body: dict[str, Any]) -> str | None:
    """What constrains sampling for this request body, or None when it samples freely."""
    choice = body.get("tool_choice")
    tools = body.get("tools") or []
    if tools and choice == "required":
        return "tool_choice=required"
    if tools and isinstance(choice, dict):
        return f"tool_choice={(choice.get('function') or {}).get('name')}"
    if tools and choice != "none" and any(_strict(tool) for tool in tools):
        return "strict_tools"
    structured = body.get("structured_outputs")
    if isinstance(structured, dict):
        for kind in STRUCTURED_KINDS:
            if structured.get(kind) not in (None, False):
                return "json_schema" if kind == "json" else kind
    for kind in GUIDED_KINDS:
        if body.get(f"guided_{kind}") is not None:
            return "json_schema" if kind == "json" else kind
    response_format = body.get("response_format")
    if isinstance(response_format, dict):
        declared = response_format.get("type")
        if declared in ("json_schema", "json_object", "structural_tag"):
            return str(declared)
    return None


def _strict(tool: Any) -> bool:
    if not isinstance(tool, dict):
        return False
    function = tool.get("function")
    return bool(tool.get("strict") or (isinstance(function, dict) and function.get("strict")))


def forced_positions(choice: dict[str, Any]) -> list[int]:
    """Positions of a constrained choice where the grammar allowed one token only.

    Needs the choice's `logprobs.content` with at least two `top_logprobs` per position
    (the policy endpoint asks for them on constrained requests)."""
    forced = []
    for index, entry in enumerate((choice.get("logprobs") or {}).get("content") or []):
        top = entry.get("top_logprobs") or []
        # The runner-up masked: one token was allowed, so it is the one sampled.
        if len(top) >= 2 and top[1].get("logprob", 0.0) <= FORCED_FLOOR:
            forced.append(index)
    return forced


def as_asked(response: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """A copy of `response` (a completion or a stream chunk) as the client's `body` asked
    for it. The policy endpoint always asks the engine for per-token log-probs (training
    needs them) and, under a grammar, for two `top_logprobs`; the client gets log-probs
    only when it asked (`logprobs`), with at most the `top_logprobs` it asked for. Not
    sending the rest also spares the client parsing it: an OpenAI client builds thousands
    of objects for a 512-token answer's log-probs. Token ids stay (plain integer lists,
    and what keeps a client-built trajectory's tokens exact)."""
    asked = bool(body.get("logprobs"))
    keep = int(body.get("top_logprobs") or 0)
    choices = []
    for choice in response.get("choices") or []:
        logprobs = choice.get("logprobs")
        if logprobs is not None and not asked:
            choice = {**choice, "logprobs": None}
        elif logprobs and logprobs.get("content"):
            content = [
                {**entry, "top_logprobs": (entry.get("top_logprobs") or [])[:keep]}
                for entry in logprobs["content"]
            ]
            choice = {**choice, "logprobs": {**logprobs, "content": content}}
        choices.append(choice)
    return {**response, "choices": choices}
