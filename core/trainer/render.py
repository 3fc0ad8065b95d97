"""Client-built trajectories as token sequences, through the model's chat template.

A trajectory recorded by the policy endpoint carries the exact token ids the engine saw
and sampled, and the trainer uses them as they are (sequences.py) — the exact path. A
trajectory the client built itself — from its own OpenAI `Choice` objects, plain assistant
messages, or logs — carries text. `render_groups` turns each such history into the same
`SampledChoice`s the exact path reads, so everything downstream is shared:

- which turns are trained: the `client_choices` (ART's `Choice` items) when there are any,
  else every assistant message; the other messages are context;
- the prompt of a trained turn `i`: `messages[:i]` rendered with the model's chat template
  and its generation prompt, exactly as the engine renders a request;
- its reply: the choice's own `token_ids` where the server returned them (exact), else the
  tokens that `messages[:i + 1]` adds to that prompt, up to and including the end-of-turn
  token (the template's newline after it is context) — re-tokenized;
- the behaviour log-probs: the choice's, where its tokens line up with the reply's (token
  ids given, or each token's text equal to the decoded reply token); NaN elsewhere, which
  only a choice whose `policy` is `client` may carry past the log-prob checks, and which
  the loss replaces with the trainer's own detached log-prob at the sampling weights
  before it measures the sampler mismatch, leaving those tokens out of that measure
  (objective.py), i.e. those tokens are treated as sampled by the policy being trained.

`RenderStats` counts both departures from the exact path (re-tokenized tokens, tokens
without a sampler log-prob), and the step's metrics report them. What it costs: the
re-tokenized ids may not be the ones a model would have sampled for that text, and the
importance ratio of a token without a log-prob is 1 by construction, so replies written
by another model are learned as if this policy had written them.

A message the template cannot render is refused before anything trains, naming the
trajectory, the message index and the fix: a role the template does not know or silently
drops, an assistant tool call without an id, a tool result without its `tool_call_id`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcoach.errors import TrainingDataError
from rlcoach.models.chat_template import template_messages
from rlcoach.models.families import family_of
from rlcoach.trajectory.histories import content_text
from rlcoach.trajectory.trajectories import (
    CLIENT_POLICY,
    ClientChoice,
    History,
    SampledChoice,
    TrajectoryGroup,
)

__all__ = [
    "CLIENT_POLICY",
    "RenderStats",
    "client_built",
    "end_token_ids",
    "render_groups",
    "render_history",
]

_ROLES = {"system", "developer", "user", "assistant", "tool"}


@dataclass(slots=True)
class RenderStats:
    """How far a step's sequences are from the exact path."""

    trajectories: int = 0
    """Client-built trajectories rendered."""
    tokens_retokenized: int = 0
    """Trained tokens obtained by re-tokenizing text (no sampled ids were given)."""
    tokens_without_sampler_logprobs: int = 0
    """Trained tokens with no sampler log-prob (the trainer uses its own)."""

    def as_dict(self) -> dict[str, float]:
        return {
            "client_trajectories": float(self.trajectories),
            "tokens_retokenized": float(self.tokens_retokenized),
            "tokens_without_sampler_logprobs": float(self.tokens_without_sampler_logprobs),
        }


def end_token_ids(tokenizer: Any, model_path: str | Path | None = None) -> set[int]:
    """The tokens that end a reply: the tokenizer's EOS, the generation config's EOS ids
    and the model family's end-of-turn token (Gemma's `<end_of_turn>` is not its EOS)."""
    ids: set[Any] = {tokenizer.eos_token_id}
    if model_path is not None:
        config = Path(model_path) / "generation_config.json"
        if config.is_file():
            eos = json.loads(config.read_text()).get("eos_token_id")
            ids |= set(eos) if isinstance(eos, list) else {eos}
        family = family_of(model_path)
        if family is not None and family.end_of_turn:
            ids.add(tokenizer.convert_tokens_to_ids(family.end_of_turn))
    return {i for i in ids if isinstance(i, int) and i >= 0}


class _Template:
    """The tokenizer's chat template applied the way the engine applies it."""

    def __init__(self, tokenizer: Any, end_ids: set[int]) -> None:
        self.tokenizer = tokenizer
        self.end_ids = end_ids

    def text(self, messages: list[dict[str, Any]], tools: Any, generation: bool) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                template_messages(messages),
                tools=tools or None,
                tokenize=False,
                add_generation_prompt=generation,
            )
        )

    def ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def _refuse(trajectory_id: str, index: int, message: Any, why: str, fix: str) -> TrainingDataError:
    role = message.get("role") if isinstance(message, dict) else None
    return TrainingDataError(
        f"trajectory {trajectory_id!r}: message {index} (role {role!r}) {why}; fix: {fix}"
    )


def _check_messages(messages: list[dict[str, Any]], trajectory_id: str) -> None:
    """Refuse what no chat template renders faithfully."""
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in _ROLES:
            raise _refuse(
                trajectory_id,
                index,
                message,
                "has a role chat templates do not know",
                "use system, user, assistant or tool",
            )
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(call, dict) or not call.get("id") or not isinstance(function, dict):
                raise _refuse(
                    trajectory_id,
                    index,
                    message,
                    f"has a tool call without an id ({str(call)[:80]!r})",
                    "keep each call as the server returned it ({'id': ..., 'type': "
                    "'function', 'function': {'name': ..., 'arguments': ...}}) and answer it "
                    "with a tool message carrying the same tool_call_id",
                )
        if role == "tool" and not message.get("tool_call_id"):
            raise _refuse(
                trajectory_id,
                index,
                message,
                "is a tool result without a tool_call_id",
                "set tool_call_id to the id of the assistant tool call it answers",
            )


def _shown(message: dict[str, Any]) -> list[str]:
    """Pieces of a message any faithful rendering must contain."""
    pieces = [content_text(message.get("content")).strip()]
    pieces += [
        str((call.get("function") or {}).get("name") or "")
        for call in message.get("tool_calls") or []
    ]
    return [p for p in pieces if p]


def _render_checked(
    template: _Template, history: History, trajectory_id: str, trained: list[int]
) -> dict[int, tuple[str, str]]:
    """For each trained message `i`: (the text of `messages[:i]` with the generation
    prompt, the text of `messages[:i + 1]`), after checking, message by message, that
    the template renders every message and shows it."""
    messages = [dict(m) for m in history.messages]
    texts: dict[int, tuple[str, str]] = {}
    for index, message in enumerate(messages):
        if index in trained and index == 0:
            raise _refuse(
                trajectory_id,
                index,
                message,
                "is a reply with no message before it, so it has no prompt",
                "start the conversation with the system or user message it answers",
            )
        try:
            full = template.text(messages[: index + 1], history.tools, generation=False)
            if index in trained:
                prompt = template.text(messages[:index], history.tools, generation=True)
                texts[index] = (prompt, full)
        except Exception as e:  # a Jinja error, or a template that raises on a role
            raise _refuse(
                trajectory_id,
                index,
                message,
                f"cannot be rendered by the model's chat template ({type(e).__name__}: {e})",
                "use the roles and message shapes this model's template supports (see its "
                "chat_template.jinja), or pass EngineConfig(chat_template=...) with one that "
                "does",
            ) from e
        missing = [p for p in _shown(message) if p not in full]
        if missing:
            raise _refuse(
                trajectory_id,
                index,
                message,
                f"is dropped by the model's chat template ({missing[0][:60]!r} does not "
                "appear in the rendered conversation): the template lacks this role or field",
                "use a role the template renders (e.g. merge it into a user or system "
                "message), or pass EngineConfig(chat_template=...) with a template that has it",
            )
    return texts


def _line_up(reply: list[int], choice: ClientChoice | None, template: _Template) -> list[float]:
    """The sampler's log-prob of each reply token where it can be trusted, else NaN."""
    logprobs = [math.nan] * len(reply)
    if choice is None or choice.logprobs is None:
        return logprobs
    if choice.token_ids is not None and choice.token_ids == reply:
        return list(choice.logprobs)
    if choice.tokens is None:
        return logprobs
    for position, (token_id, text, logprob) in enumerate(
        zip(reply, choice.tokens, choice.logprobs, strict=False)
    ):
        if template.tokenizer.decode([token_id]) != text:
            break
        logprobs[position] = logprob
    return logprobs


def render_history(
    history: History, template: _Template, trajectory_id: str, stats: RenderStats
) -> list[SampledChoice]:
    """The trained turns of a client-built history as `SampledChoice`s (module doc)."""
    _check_messages(list(history.messages), trajectory_id)
    by_index = {c.message_index: c for c in history.client_choices}
    trained = sorted(by_index) or [
        i for i, m in enumerate(history.messages) if m.get("role") == "assistant"
    ]
    if not trained:
        return []
    texts = _render_checked(template, history, trajectory_id, trained)
    choices = []
    for index in trained:
        prompt_text, full_text = texts[index]
        prompt = template.ids(prompt_text)
        choice = by_index.get(index)
        if choice is not None and choice.token_ids is not None:
            reply = list(choice.token_ids)
        else:
            if not full_text.startswith(prompt_text):
                raise _refuse(
                    trajectory_id,
                    index,
                    history.messages[index],
                    "does not render as a continuation of its own prompt, so its tokens "
                    "cannot be told apart from the prompt's",
                    "check the template's generation prompt, or record the call through "
                    "the policy endpoint (exact tokens)",
                )
            reply = template.ids(full_text[len(prompt_text) :])
            ends = [k for k, token in enumerate(reply) if token in template.end_ids]
            reply = reply[: ends[-1] + 1] if ends else reply
            stats.tokens_retokenized += len(reply)
        if not reply:
            continue
        logprobs = _line_up(reply, choice, template)
        stats.tokens_without_sampler_logprobs += sum(math.isnan(x) for x in logprobs)
        choices.append(
            SampledChoice(
                message=dict(history.messages[index]),
                finish_reason=choice.finish_reason if choice else None,
                prompt_token_ids=prompt,
                token_ids=reply,
                logprobs=logprobs,
                policy=CLIENT_POLICY,
            )
        )
    return choices


def _client_built(history: History) -> bool:
    return not history.choices and any(m.get("role") == "assistant" for m in history.messages)


def client_built(groups: list[TrajectoryGroup]) -> bool:
    """Whether any history in `groups` needs rendering (has replies but no sampled ids)."""
    return any(_client_built(h) for g in groups for t in g.trajectories for h in t.histories())


def render_groups(
    groups: list[TrajectoryGroup], tokenizer: Any, model_path: str | Path | None = None
) -> tuple[list[TrajectoryGroup], RenderStats]:
    """`groups` with every client-built history rendered into `SampledChoice`s (copies;
    recorded histories and the input groups are left as they are). `model_path` tells
    the end-of-turn tokens (`end_token_ids`)."""
    stats = RenderStats()
    template: _Template | None = None
    out = []
    for group in groups:
        if not any(_client_built(h) for t in group.trajectories for h in t.histories()):
            out.append(group)
            continue
        template = template or _Template(tokenizer, end_token_ids(tokenizer, model_path))
        trajectories = []
        for trajectory in group.trajectories:
            histories = trajectory.histories()
            if not any(_client_built(h) for h in histories):
                trajectories.append(trajectory)
                continue
            stats.trajectories += 1
            rendered = [
                h.model_copy(update={"choices": render_history(h, template, trajectory.id, stats)})
                if _client_built(h)
                else h
                for h in histories
            ]
            main, *others = rendered
            trajectories.append(
                trajectory.model_copy(
                    update={"choices": main.choices, "additional_histories": others}
                )
            )
        out.append(group.model_copy(update={"trajectories": trajectories}))
    return out, stats
