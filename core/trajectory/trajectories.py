"""Trajectories: what a rollout produced, with the exact tokens the policy sampled.

A rollout is one attempt at one task. Everything the policy sampled during it is a
`SampledChoice` (the assistant message plus the prompt ids, sampled ids and their
logprobs that the engine reported), so the trainer never re-tokenizes text. Calls that
continue one conversation form a `History`; a trajectory has a main history and, for
calls that do not continue it (a sub-agent, a summariser), additional histories.
Several trajectories for the same task form a `TrajectoryGroup`: GRPO compares rewards
within a group. All of these are pydantic wire types: they cross HTTP and go to disk
(one JSON line per group) and come back without loss.

What other parts need to know about a rollout is a field, never a convention in text: a
judge's verdict is a `Verdict` on the trajectory, and a tool call that failed is a tool
message with `"is_error": true` (`tool_message(..., error=True)`; LangChain's
`status: "error"` counts too), whatever its text says.

A trajectory can also be built by the client, from its own messages and the replies its
own OpenAI client received (ART's `messages_and_choices`: message dicts and OpenAI
`Choice` objects, in order). Each `Choice` becomes an assistant message plus a
`ClientChoice` that keeps what the server reported about it (log-probs, token ids when
the server returns them). Such a trajectory has no exact prompt tokens: the trainer
renders it with the model's chat template (trainer/render.py), which costs exactness but
lets logs and other clients' replies be trained on. `trajectory.messages()` and a live
`trajectory.messages_and_choices` list work as ART spells them.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import time
import traceback
import uuid
from collections.abc import Awaitable, Generator, Iterable
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    model_validator,
)

from rlcoach.errors import DataError, TrainingDataError
from rlcoach.models.served_name import ServedName
from rlcoach.paths import write_text_atomic
from rlcoach.trajectory.client_choices import (
    ClientChoice,
    MessageList,
    MessagesAndChoicesView,
    check_client_choices,
    from_messages_and_choices,
)
from rlcoach.validation import Record

__all__ = [
    "TOOL_ERROR_KEY",
    "ChatRecord",
    "ClientChoice",
    "History",
    "Message",
    "MessageList",
    "Messages",
    "MessagesAndChoices",
    "RolloutFailure",
    "SampledChoice",
    "Scalar",
    "Tool",
    "Tools",
    "Trajectory",
    "TrajectoryGroup",
    "Verdict",
    "is_tool_error",
    "load_groups",
    "policy_version_of",
    "save_groups",
    "tool_message",
]

Message = dict[str, Any]
"""An OpenAI chat message (`role`, `content`, optional `tool_calls`, `tool_call_id`)."""

Tool = dict[str, Any]
"""An OpenAI tool schema (`{"type": "function", "function": {...}}`)."""

Messages = list[Message]
Tools = list[Tool]
MessagesAndChoices = list[Any]
"""Messages and OpenAI `Choice` objects in conversation order (ART's form; `Trajectory`
accepts it as `messages_and_choices=`)."""

Scalar = str | int | float | bool | None
"""A metadata value: kept simple so every sink can show it."""

TOOL_ERROR_KEY = "is_error"
"""The key of a tool message that marks its call as failed (`"is_error": true`, as MCP's
`CallToolResult.isError`); engines ignore it, timelines, sinks and the report count it."""


def tool_message(call_id: str | None, content: str, *, error: bool = False) -> Message:
    """The tool message answering call `call_id`; `error=True` marks the call as failed.

    The text is what the policy reads (say what went wrong there too); the flag is what
    rlcoach counts, so a failed call is never recognised by its wording."""
    message: Message = {"role": "tool", "content": content}
    if call_id is not None:
        message["tool_call_id"] = call_id
    if error:
        message[TOOL_ERROR_KEY] = True
    return message


def is_tool_error(message: Message) -> bool:
    """Whether a tool message says its call failed: `"is_error": true`, or LangChain's
    `status: "error"`. The text is never read."""
    return message.get(TOOL_ERROR_KEY) is True or message.get("status") == "error"


TIMING_KEY = "rlcoach_timing"
"""The key under which the policy endpoint hands a response's timing (`started_at`,
`latency_s`) to its recorder, which takes it out (`Exchange.recorded`): no exchange, and
nothing a client receives, carries it."""

CLIENT_POLICY = "client"
"""The `policy` of a reply the trainer rendered from a client-built trajectory
(trainer/render.py): no sampler recorded its log-probs."""

CHOICE_KEY = "rlcoach"
"""The key under which the policy endpoint hands its notes on a choice (`forced`
positions, the `constraint`) to its recorder, which takes them out into `Exchange.notes`."""


def policy_version_of(served_name: object) -> int | None:
    """The step of a served name `name@step` (None for a name without `@<digits>`)."""
    parsed = ServedName.parse(served_name)
    return parsed.step if parsed is not None else None


class SampledChoice(Record):
    """One completion the policy sampled, with the exact tokens behind it."""

    # A rendered client choice (trainer/render.py) has NaN where no sampler log-prob
    # exists; it must cross to the training ranks as NaN, not as a null.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    message: Message
    """The assistant message as the client received it (content and/or tool_calls)."""
    finish_reason: str | None = None
    """Why sampling stopped: `stop`, `length`, `tool_calls`."""
    prompt_token_ids: list[int]
    """The prompt exactly as the engine tokenized it (chat template applied)."""
    token_ids: list[int]
    """The sampled token ids, end-of-turn token included when the engine sampled it."""
    logprobs: list[float]
    """The engine's log-probability of each sampled token (the behaviour policy), from
    the model's own distribution: under a sampling constraint, the unconstrained one. NaN
    where none is known (`logprobs_may_be_unknown`): in a client-built reply the trainer
    rendered (`policy == "client"`), and in a constrained choice whose log-probs the
    policy endpoint left to the trainer (endpoint/rescore.py); the trainer's own detached
    log-probs at the sampling weights stand in for those (objective.py)."""
    forced: list[int] = Field(default_factory=list)
    """Positions in `token_ids` that a sampling constraint forced (the only token it
    allowed): recorded and shown, never trained (see docs/capture.md)."""
    constraint: str | None = None
    """What constrained sampling (`json_schema`, `json_object`, `regex`, `choice`,
    `grammar`, `structural_tag`, `tool_choice=required`, `tool_choice=<name>`), or None
    when the policy sampled freely."""
    policy: str
    """The served name that sampled it, `name@step` (or the base model's name; `client`
    for a reply rendered from a client-built trajectory)."""
    policy_version: int | None = None
    """The policy version (training step) that sampled it: the `step` of `name@step`;
    None for a name without one (the base model's own name, a model served elsewhere,
    `client`). Filled from `policy` when not given, so files written before it existed
    load the same. The trainer drops samples more than `TrainConfig.max_staleness`
    versions older than the model being trained (staleness.py)."""
    teacher_logprobs: list[float] | None = None
    """A teacher's log-probability of each sampled token, one per `token_ids`, written by
    on-policy distillation (`rlcoach.Teacher`, docs/distillation.md); None when no
    teacher scored the choice. The trainer adds `teacher_coef * (teacher - sampler)` to
    each token's advantage (the reverse KL to the teacher)."""
    started_at: float | None = None
    """Unix time the policy endpoint received the request (None if not recorded)."""
    latency_s: float | None = None
    """Seconds the engine took to answer it (None if not recorded)."""

    @property
    def logprobs_may_be_unknown(self) -> bool:
        """Whether `logprobs` may hold NaN: a rendered client reply's or a constrained
        choice's (see `logprobs`); any other choice's come from the sampler."""
        return self.policy == CLIENT_POLICY or self.constraint is not None

    @model_validator(mode="before")
    @classmethod
    def _version_from_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("policy_version") is None:
            version = policy_version_of(data.get("policy"))
            if version is not None:
                data = {**data, "policy_version": version}
        return data

    @model_validator(mode="after")
    def _lengths_agree(self) -> SampledChoice:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"a sampled choice has {len(self.token_ids)} token ids but "
                f"{len(self.logprobs)} logprobs; they must pair one to one — record the "
                "choice through the policy endpoint, which returns both"
            )
        if self.teacher_logprobs is not None and len(self.teacher_logprobs) != len(self.token_ids):
            raise ValueError(
                f"a sampled choice has {len(self.token_ids)} token ids but "
                f"{len(self.teacher_logprobs)} teacher log-probs; a teacher scores every "
                "sampled token once — score the trajectory with `Teacher.score`"
            )
        if any(not 0 <= index < len(self.token_ids) for index in self.forced):
            raise ValueError(
                f"a sampled choice marks positions {self.forced} as forced but has "
                f"{len(self.token_ids)} tokens; forced positions index `token_ids`"
            )
        return self

    @classmethod
    def from_openai(cls, choice: Any, response: Any) -> SampledChoice:
        """Build from an `openai` ChatCompletion choice returned by the policy endpoint."""
        data = choice.model_dump() if hasattr(choice, "model_dump") else dict(choice)
        resp = response.model_dump() if hasattr(response, "model_dump") else dict(response)
        return choice_from_response_json(data, resp)


def choice_from_response_json(
    choice: dict[str, Any],
    response: dict[str, Any],
    *,
    timing: dict[str, float] | None = None,
    note: dict[str, Any] | None = None,
) -> SampledChoice:
    """Build a `SampledChoice` from the JSON of one choice of a chat completion, with the
    endpoint's `timing` of the call and its `note` on the choice (exchange.py)."""
    content = (choice.get("logprobs") or {}).get("content") or []
    token_ids = choice.get("token_ids")
    prompt_ids = response.get("prompt_token_ids")
    if token_ids is None or prompt_ids is None:
        raise TrainingDataError(
            "this chat completion carries no token ids; it was not produced by the "
            "rlcoach policy endpoint (which always returns `prompt_token_ids` and "
            "`choices[].token_ids`); fix: send the request through `model.openai_client()`"
        )
    message = {k: v for k, v in (choice.get("message") or {}).items() if v is not None}
    message.setdefault("role", "assistant")
    timing = timing or {}
    recorded = note or {}
    return SampledChoice(
        message=message,
        finish_reason=choice.get("finish_reason"),
        prompt_token_ids=list(prompt_ids),
        token_ids=list(token_ids),
        # None: a constrained choice whose log-probs the trainer computes (rescore.py)
        logprobs=[math.nan if e["logprob"] is None else float(e["logprob"]) for e in content],
        forced=list(recorded.get("forced") or []),
        constraint=recorded.get("constraint"),
        policy=str(response.get("model", "")),
        started_at=timing.get("started_at"),
        latency_s=timing.get("latency_s"),
    )


class History(Record):
    """One conversation: its messages and the choices sampled along it, in order."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    messages: MessageList = Field(default_factory=MessageList)
    """The conversation, sampled assistant turns included."""
    tools: list[Tool] | None = None
    """The tools offered to the policy in this conversation."""
    choices: list[SampledChoice] = Field(default_factory=list)
    """What the policy sampled, in call order; the trainer learns from these tokens."""
    client_choices: list[ClientChoice] = Field(default_factory=list)
    """Assistant turns the client received itself (no exact tokens; see `ClientChoice`)."""

    @model_validator(mode="before")
    @classmethod
    def _messages_and_choices_in(cls, data: Any) -> Any:
        return from_messages_and_choices(data)

    @model_validator(mode="after")
    def _client_choices_fit(self) -> History:
        check_client_choices(self.messages, self.client_choices)
        return self

    @property
    def messages_and_choices(self) -> MessagesAndChoicesView:
        """The conversation as ART's list of messages and `Choice` objects (live)."""
        return MessagesAndChoicesView(self)


class RolloutFailure(Record):
    """A rollout that raised: recorded and counted, not allowed to kill the step."""

    model_config = ConfigDict(extra="forbid")

    type: str
    message: str
    traceback: str = ""


class Verdict(Record):
    """What a judge (RULER or another) said about one trajectory."""

    model_config = ConfigDict(extra="forbid")

    judge: str
    """Who judged: `ruler`, or the name a custom judge gives itself."""
    score: float | None = None
    """The judge's score; None when it gave none (`error` says why)."""
    explanation: str = ""
    """The judge's reason for the score."""
    error: str | None = None
    """Why there is no score (the judge failed; the reward was kept or the group dropped)."""

    def describe(self) -> str:
        """One line: `ruler 0.800: <why>`, or `ruler gave no score: <error>`."""
        if self.score is None:
            return f"{self.judge} gave no score: {self.error or 'no reason given'}"
        line = f"{self.judge} {self.score:.3f}"
        return f"{line}: {self.explanation}" if self.explanation else line


class Trajectory(Record):
    """One rollout: its histories, its reward and what the user wants to keep with it."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    """Unique id; also the rollout id the policy endpoint recorded the calls under."""
    messages: MessageList = Field(default_factory=MessageList)
    """The main conversation, sampled assistant turns included."""
    tools: list[Tool] | None = None
    """The tools offered in the main conversation."""
    choices: list[SampledChoice] = Field(default_factory=list)
    """Choices sampled along the main conversation, in call order."""
    client_choices: list[ClientChoice] = Field(default_factory=list)
    """Assistant turns of the main conversation that the client received itself (see
    `ClientChoice`); with neither these nor `choices`, every assistant message is trained."""
    additional_histories: list[History] = Field(default_factory=list)
    """Calls that do not continue the main conversation (sub-agents, summarisers)."""
    reward: float = 0.0
    metrics: dict[str, float] = Field(default_factory=dict)
    """Numbers to average per step (e.g. `success`, `tool_calls`)."""
    metadata: dict[str, Scalar] = Field(default_factory=dict)
    """What the rollout was about (task id, split, ...)."""
    verdicts: list[Verdict] = Field(default_factory=list)
    """What judges said about this rollout, in the order they judged it."""
    logs: list[str] = Field(default_factory=list)
    """Free-form notes for a person to read (nothing parses them)."""
    started_at: float | None = None
    """Unix time the rollout scope opened (None if not recorded)."""
    finished_at: float | None = None
    """Unix time the rollout scope closed (None if not recorded)."""

    @model_validator(mode="before")
    @classmethod
    def _messages_and_choices_in(cls, data: Any) -> Any:
        return from_messages_and_choices(data)

    @model_validator(mode="after")
    def _client_choices_fit(self) -> Trajectory:
        check_client_choices(self.messages, self.client_choices)
        return self

    @property
    def messages_and_choices(self) -> MessagesAndChoicesView:
        """The main conversation as ART's list of messages and `Choice` objects (live:
        appending a `Choice` adds its message and marks it trained)."""
        return MessagesAndChoicesView(self)

    def log(self, line: str) -> None:
        """Keep a note with the trajectory (`logs`)."""
        self.logs.append(line)

    def finish(self) -> Trajectory:
        """Mark the rollout finished now (`finished_at`, unless already set) and return
        the trajectory: ART's `trajectory.finish()`. A `model.rollout()` scope sets it."""
        if self.finished_at is None:
            self.finished_at = time.time()
        return self

    def track_duration(self, name: str) -> _Duration:
        """`async with trajectory.track_duration("search"):` (or a plain `with`) adds the
        seconds spent in the block to `metrics["search_duration"]`, as in ART."""
        return _Duration(self.metrics, f"{name}_duration")

    def histories(self) -> list[History]:
        """The main history followed by the additional ones."""
        main = History(
            messages=self.messages,
            tools=self.tools,
            choices=self.choices,
            client_choices=self.client_choices,
        )
        return [main, *self.additional_histories]

    @property
    def policy_versions(self) -> list[str]:
        """The served names that sampled this trajectory's choices (usually one)."""
        names = {c.policy for h in self.histories() for c in h.choices}
        return sorted(names)

    @property
    def policy_version(self) -> int | None:
        """The oldest policy version among its choices (a multi-turn rollout that spans a
        publish is as stale as its first call); None when no choice carries a version."""
        versions = [c.policy_version for h in self.histories() for c in h.choices]
        known = [v for v in versions if v is not None]
        return min(known) if known else None

    def sampled_token_count(self) -> int:
        return sum(len(c.token_ids) for h in self.histories() for c in h.choices)


class _Duration:
    """Adds the time spent inside a `with` / `async with` block to one metric."""

    def __init__(self, metrics: dict[str, float], key: str) -> None:
        self._metrics, self._key, self._started = metrics, key, 0.0

    def __enter__(self) -> None:
        self._started = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        spent = time.monotonic() - self._started
        self._metrics[self._key] = self._metrics.get(self._key, 0.0) + spent

    async def __aenter__(self) -> None:
        self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)


def failure_from_exception(error: BaseException) -> RolloutFailure:
    """A raised exception as the `RolloutFailure` a group records."""
    return RolloutFailure(
        type=type(error).__name__,
        message=str(error),
        traceback="".join(traceback.format_exception(error)),
    )


class TrajectoryGroup(Record):
    """Attempts at the same task: GRPO's unit of comparison.

    Built from trajectories, or — as ART writes it — from the rollouts still to run:
    `TrajectoryGroup(rollout(model, task) for _ in range(8))` is a pending group that
    `gather_trajectory_groups` runs (or that can be awaited on its own, giving the
    finished group). Exceptions among the items are recorded as failures.
    """

    model_config = ConfigDict(extra="forbid")

    trajectories: list[Trajectory] = Field(default_factory=list)
    failures: list[RolloutFailure] = Field(default_factory=list)
    """Rollouts of this group that raised; they are not trained on."""
    metadata: dict[str, Scalar] = Field(default_factory=dict)

    _pending: list[Awaitable[Trajectory]] = PrivateAttr(default_factory=list)

    def __init__(
        self,
        trajectories: Iterable[Trajectory | BaseException | Awaitable[Trajectory]] = (),
        *,
        exceptions: Iterable[BaseException] = (),
        **data: Any,
    ) -> None:
        done: list[Any] = []
        pending: list[Awaitable[Trajectory]] = []
        raised = list(exceptions)
        for item in trajectories:
            if isinstance(item, BaseException):
                raised.append(item)
            elif inspect.isawaitable(item) and not isinstance(item, BaseModel):
                pending.append(item)
            else:
                done.append(item)  # a Trajectory, or its dict form for pydantic to check
        failures = list(data.pop("failures", [])) + [failure_from_exception(e) for e in raised]
        super().__init__(trajectories=done, failures=failures, **data)
        self._pending = pending

    @property
    def pending(self) -> list[Awaitable[Trajectory]]:
        """Rollouts given to the constructor that have not run yet."""
        return self._pending

    def split_pending(self) -> tuple[TrajectoryGroup, list[Awaitable[Trajectory]]]:
        """(a copy of this group without its pending rollouts, those rollouts)."""
        finished = self.model_copy()
        finished._pending = []
        return finished, list(self._pending)

    def __await__(self) -> Generator[Any, None, TrajectoryGroup]:
        return self._finish().__await__()

    async def _finish(self) -> TrajectoryGroup:
        if not self._pending:
            await asyncio.sleep(0)
            return self
        from rlcoach.rollout.gather import gather_trajectory_groups

        (group,) = await gather_trajectory_groups([self], progress=False, max_failure_fraction=1.0)
        return group

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    @property
    def exceptions(self) -> list[RolloutFailure]:
        """The failures, under ART's name."""
        return self.failures


class ChatRecord(Record):
    """A conversation to imitate (supervised fine-tuning), e.g. one line of a JSONL file.

    Unlike a `Trajectory`, it carries no sampled tokens: the trainer renders it with the
    model's chat template and trains on the assistant turns."""

    model_config = ConfigDict(extra="forbid")

    messages: list[Message]
    """The conversation; every assistant message is a training target."""
    tools: list[Tool] | None = None
    """The tools offered, rendered into the prompt as the engine would."""
    metadata: dict[str, Scalar] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _has_roles(self) -> ChatRecord:
        for index, message in enumerate(self.messages):
            if not isinstance(message, dict) or message.get("role") not in {
                "system",
                "user",
                "assistant",
                "tool",
                "developer",
            }:
                raise ValueError(
                    f"message {index} ({str(message)[:80]!r}) has no valid role; fix: give "
                    "every message a role of system, user, assistant or tool"
                )
        return self


def save_groups(path: str | os.PathLike[str], groups: Iterable[TrajectoryGroup]) -> Path:
    """Write groups as JSON lines, atomically (a temp file renamed over the target)."""
    return write_text_atomic(path, "".join(group.model_dump_json() + "\n" for group in groups))


def load_groups(path: str | os.PathLike[str]) -> list[TrajectoryGroup]:
    """Read groups written by `save_groups`."""
    groups = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                groups.append(TrajectoryGroup.model_validate_json(line))
            except (ValueError, TypeError) as e:  # TypeError: TrajectoryGroup's own __init__
                raise DataError(
                    f"{path}:{number} is not a trajectory group ({e}); fix: write the file "
                    "with save_groups, one TrajectoryGroup as JSON per line"
                ) from e
    return groups
