"""The Langfuse sink: rollouts as traces, judge verdicts as scores, steps as traces.

For each training step it gets the groups (before the step) and the metrics record
(after it), on its own thread (see `rlcoach.observe.sinks`), and sends through the official SDK:

- each rollout a trace named `<project>/<model>/<step>`, in the session `<project>/<model>`,
  tagged with project, model, `step:<n>` and your tags; its metadata is the scenario's
  (`Trajectory.metadata`) plus the training step and group. Its trace id is derived
  from the trajectory id (`Langfuse.create_trace_id(seed=id)`), so a trajectory in
  `trajectories/<step>.jsonl` leads straight to its trace;
- under a root span `rollout`, each policy call a generation (the prompt messages, the
  reply, model `name@step`, token usage from the exact token ids, start and end times
  as the policy endpoint measured them); each tool call a tool span (arguments, result,
  ERROR level when it failed); additional histories (sub-agents) under spans of their own;
- the reward a score on the trace, and each judge's score another (`ruler` for RULER), from
  the trajectory's `verdicts`, with the judge's explanation as the comment; trajectory
  metrics named in `score_metrics` too;
- a rollout that raised, a trace at ERROR level with the exception;
- each step's metrics a trace `<project>/<model>/<step>/train` whose numbers (reward
  mean/std, loss, KL, grad norm, tokens, step time, publish latency) are also scores, so
  Langfuse can chart them across steps.

Rollouts are sent after they happened, so spans are created with their recorded times:
the sink owns an OpenTelemetry `TracerProvider` (never the global one) that it hands to
the `Langfuse` client, and wraps the spans it starts in the SDK's public observation
classes. The SDK keeps one client per public key for the life of the process, so sinks of
the same key share one client and provider, and `close()` flushes without shutting down.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ConfigDict, Field

from rlcoach.config import parse_config
from rlcoach.errors import ConfigError
from rlcoach.observe.sinks import RunInfo
from rlcoach.trajectory.histories import content_text
from rlcoach.trajectory.timeline import PolicyCall, ToolCall, timeline
from rlcoach.trajectory.trajectories import Message, Trajectory, TrajectoryGroup, Verdict
from rlcoach.validation import Config

__all__ = ["STEP_SCORES", "LangfuseConfig", "LangfuseSink", "trace_id"]

logger = logging.getLogger(__name__)

STEP_SCORES = (
    "reward_mean",
    "reward_std",
    "loss",
    "kl",
    "grad_norm",
    "clip_fraction",
    "mismatch_abs_mean",
    "mismatch_abs_max",
    "mismatch_kl_k3",
    "mismatch_beyond_fraction",
    "sampled_tokens",
    "total_tokens",
    "seconds",
    "step_seconds",
    "publish_seconds",
    "rollout_failures",
)
"""Metrics of a step record that become scores on its step trace (when present)."""


class LangfuseConfig(Config):
    """Options of `LangfuseSink` (each defaults to the standard `LANGFUSE_*` variable)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    public_key: str | None = None
    """Default: `LANGFUSE_PUBLIC_KEY`."""
    secret_key: str | None = None
    """Default: `LANGFUSE_SECRET_KEY`."""
    host: str | None = None
    """Default: `LANGFUSE_BASE_URL`, else `LANGFUSE_HOST`, else Langfuse Cloud."""
    environment: str | None = None
    """Langfuse environment (default: `LANGFUSE_TRACING_ENVIRONMENT`, else `default`)."""
    tags: list[str] = Field(default_factory=list)
    """Extra tags on every trace."""
    score_metrics: list[str] = Field(default_factory=lambda: ["success", "original_reward"])
    """Trajectory metrics sent as scores too (when a trajectory has them)."""
    max_text_chars: int = Field(20_000, ge=100)
    """Each message text is cut to this many characters (the cut is marked)."""
    timeout_s: int = Field(10, ge=1)
    """HTTP timeout of the SDK's requests."""


def trace_id(trajectory_id: str) -> str:
    """The Langfuse trace id of a trajectory (32 hex digits derived from its id)."""
    from langfuse import Langfuse

    return Langfuse.create_trace_id(seed=trajectory_id)


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


_SHARED_LOCK = threading.Lock()
_SHARED: dict[tuple[str, str], tuple[Any, Any, Any]] = {}
"""One SDK client, tracer and id generator per (public key, host)."""


def _ids_class() -> Any:
    """An OpenTelemetry id generator that can be told the next trace id (thread-local)."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class NextTraceId(RandomIdGenerator):
        local = threading.local()

        def generate_trace_id(self) -> int:
            wanted = getattr(self.local, "next", None)
            if wanted is not None:
                self.local.next = None
                return int(wanted)
            return super().generate_trace_id()

    return NextTraceId


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"... [{len(text) - limit} more characters cut by rlcoach]"


def _messages(messages: Sequence[Message], limit: int) -> list[Message]:
    out = []
    for message in messages:
        copy = dict(message)
        if copy.get("content") is not None:
            copy["content"] = _clip(content_text(copy["content"]), limit)
        out.append(copy)
    return out


def _short(value: Any) -> str:
    return str(value)[:150]


def _judged(trajectory: Trajectory) -> dict[str, Verdict]:
    """Each judge's latest verdict that has a score, by judge name."""
    return {v.judge: v for v in trajectory.verdicts if v.score is not None}


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class LangfuseSink:
    """A `rlcoach.observe.sinks.Sink` that sends rollouts and steps to Langfuse."""

    name = "langfuse"

    def __init__(self, **options: Any) -> None:
        self.config = parse_config(LangfuseConfig, options)
        self.run: RunInfo | None = None
        self._client: Any = None
        self._tracer: Any = None
        self._ids: Any = None
        self._key: tuple[str, str] | None = None

    @staticmethod
    def enabled_by_environment() -> bool:
        """On when the standard Langfuse keys are set (and LANGFUSE_TRACING_ENABLED is not
        `false`, the SDK's own off switch)."""
        if (_env("LANGFUSE_TRACING_ENABLED") or "true").lower() == "false":
            return False
        return bool(_env("LANGFUSE_PUBLIC_KEY") and _env("LANGFUSE_SECRET_KEY"))

    # -- lifecycle -----------------------------------------------------------------------

    def start(self, run: RunInfo) -> None:
        try:
            from langfuse import Langfuse
            from opentelemetry.sdk.trace import TracerProvider
        except ImportError as e:
            raise ConfigError(
                f"the Langfuse sink needs the langfuse SDK ({e}); fix: pip install "
                "'rlcoach[langfuse]', or unset LANGFUSE_PUBLIC_KEY to turn the sink off"
            ) from e
        c = self.config
        public_key = c.public_key or _env("LANGFUSE_PUBLIC_KEY")
        secret_key = c.secret_key or _env("LANGFUSE_SECRET_KEY")
        host = (
            c.host
            or _env("LANGFUSE_BASE_URL")
            or _env("LANGFUSE_HOST")
            or "https://cloud.langfuse.com"
        ).rstrip("/")
        if not public_key or not secret_key:
            raise ConfigError(
                f"the Langfuse sink has no {'public' if not public_key else 'secret'} key; "
                "fix: export LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY (and LANGFUSE_HOST "
                "for a self-hosted server), or pass public_key=/secret_key= in its options"
            )
        self.run = run
        self._key = (public_key, host)
        with _SHARED_LOCK:
            shared = _SHARED.get(self._key)
            if shared is None:
                ids = _ids_class()()
                provider = TracerProvider(id_generator=ids)
                client = Langfuse(
                    public_key=public_key,
                    secret_key=secret_key,
                    base_url=host,
                    environment=c.environment,
                    timeout=c.timeout_s,
                    tracer_provider=provider,
                    should_export_span=lambda span: True,
                )
                if (
                    getattr(getattr(client, "_resources", None), "tracer_provider", provider)
                    is not provider
                ):
                    logger.warning(
                        "a Langfuse client for this public key already existed in this "
                        "process with its own tracer provider; rollout traces may not be "
                        "exported — create rlcoach's backend before other Langfuse clients"
                    )
                shared = (client, provider.get_tracer("rlcoach"), ids)
                _SHARED[self._key] = shared
        self._client, self._tracer, self._ids = shared
        logger.info("sending rollouts and steps to Langfuse at %s", host)

    def close(self) -> None:
        # Flush, never shut down: the SDK keeps one client per key for the whole process,
        # and a shut-down one would silently stop sending scores for a later backend. Its
        # own exit hook shuts it down.
        if self._client is not None:
            self._client.flush()
        self._client = None

    # -- what gets sent ------------------------------------------------------------------

    def _names(self, step: int) -> tuple[str, str, list[str]]:
        assert self.run is not None
        run = self.run
        name = f"{run.project}/{run.model}/{step}"
        tags = [run.project, run.model, f"step:{step}", *self.config.tags]
        return name, f"{run.project}/{run.model}", tags

    def _span(self, kind: str, name: str, start: float, parent: Any, **fields: Any) -> Any:
        """Start an OpenTelemetry span at `start` and wrap it as a Langfuse observation."""
        import langfuse
        from opentelemetry import trace

        context = trace.set_span_in_context(parent._otel_span) if parent is not None else None
        otel_span = self._tracer.start_span(name, context=context, start_time=_ns(start))
        cls = {
            "span": langfuse.LangfuseSpan,
            "generation": langfuse.LangfuseGeneration,
            "tool": langfuse.LangfuseTool,
        }[kind]
        return cls(otel_span=otel_span, langfuse_client=self._client, **fields)

    def log_trajectories(self, step: int, groups: Sequence[TrajectoryGroup]) -> None:
        for number, group in enumerate(groups):
            for trajectory in group.trajectories:
                self._rollout(step, number, group, trajectory)
            for index, failure in enumerate(group.failures):
                self._failure(step, number, index, failure)

    def _rollout(
        self, step: int, number: int, group: TrajectoryGroup, trajectory: Trajectory
    ) -> None:
        from langfuse import propagate_attributes

        limit = self.config.max_text_chars
        line = timeline(trajectory)
        name, session, tags = self._names(step)
        policies = trajectory.policy_versions
        metadata = {key: _short(value) for key, value in trajectory.metadata.items()}
        metadata.update(training_step=str(step), group=str(number), trajectory_id=trajectory.id)
        first = line.policy_calls[0].prompt if line.policy_calls else None
        self._ids.local.next = int(trace_id(trajectory.id), 16)
        with propagate_attributes(
            trace_name=name,
            session_id=session,
            tags=tags,
            metadata=metadata,
            version=policies[-1] if policies else None,
        ):
            root = self._span(
                "span",
                "rollout",
                line.start,
                None,
                input=_messages(first or trajectory.messages[:1], limit),
                output=_messages(trajectory.messages[-1:], limit),
                metadata={
                    "scenario": trajectory.metadata,
                    "metrics": trajectory.metrics,
                    "logs": trajectory.logs,
                    "reward": trajectory.reward,
                    "policy": policies,
                    "group": number,
                    "group_metadata": group.metadata,
                },
            )
            for index, events in enumerate(line.histories):
                parent = root
                if index > 0:
                    begin = events[0].start if events else line.start
                    parent = self._span(
                        "span", f"history-{index}", begin, root, metadata={"history": index}
                    )
                for event in events:
                    if isinstance(event, PolicyCall):
                        self._generation(event, parent, limit)
                    else:
                        self._tool(event, parent, limit)
                if parent is not root:
                    parent.end(end_time=_ns(max([e.end for e in events] or [line.end])))
            root.end(end_time=_ns(line.end))
        self._scores(root.trace_id, trajectory)

    def _generation(self, call: PolicyCall, parent: Any, limit: int) -> None:
        choice = call.choice
        prompt_tokens, output_tokens = len(choice.prompt_token_ids), len(choice.token_ids)
        known = [x for x in choice.logprobs if x == x]  # NaN: left to the trainer
        mean = sum(known) / len(known) if known else None
        generation = self._span(
            "generation",
            "policy",
            call.start,
            parent,
            model=choice.policy,
            input=_messages(call.prompt, limit) if call.prompt is not None else None,
            output=_messages([choice.message], limit)[0],
            usage_details={
                "input": prompt_tokens,
                "output": output_tokens,
                "total": prompt_tokens + output_tokens,
            },
            metadata={
                "finish_reason": choice.finish_reason,
                "latency_s": choice.latency_s,
                "mean_logprob": mean,
                "trained_tokens": output_tokens - len(choice.forced),
                "forced_tokens": len(choice.forced),
                "constraint": choice.constraint,
                "history": call.history,
            },
        )
        generation.end(end_time=_ns(call.end))

    def _tool(self, call: ToolCall, parent: Any, limit: int) -> None:
        result = _clip(call.result, limit) if call.result is not None else None
        tool = self._span(
            "tool",
            call.name or "tool",
            call.start,
            parent,
            input=call.arguments,
            output=result,
            metadata={"tool_call_id": call.call_id, "answered": call.result is not None},
            level="ERROR" if call.error else None,
            status_message=_clip(call.result or "", 500) if call.error else None,
        )
        tool.end(end_time=_ns(call.end))

    def _scores(self, trace: str, trajectory: Trajectory) -> None:
        judged = _judged(trajectory)
        latest = (list(judged.values())[-1].explanation or None) if judged else None
        scores: list[tuple[str, float, str | None]] = [("reward", trajectory.reward, latest)]
        for name, verdict in judged.items():
            assert verdict.score is not None
            scores.append((name, verdict.score, verdict.explanation or None))
        for key in self.config.score_metrics:
            if key in trajectory.metrics:
                scores.append((key, trajectory.metrics[key], None))
        for name, value, comment in scores:
            self._client.create_score(
                name=name,
                value=float(value),
                trace_id=trace,
                score_id=f"{trace}-{name}",
                data_type="NUMERIC",
                comment=comment,
            )

    def _failure(self, step: int, number: int, index: int, failure: Any) -> None:
        from langfuse import propagate_attributes

        name, session, tags = self._names(step)
        now = time.time()
        with propagate_attributes(
            trace_name=name,
            session_id=session,
            tags=[*tags, "failed"],
            metadata={"training_step": str(step), "group": str(number), "failure": str(index)},
        ):
            span = self._span(
                "span",
                "rollout",
                now,
                None,
                level="ERROR",
                status_message=_clip(f"{failure.type}: {failure.message}", 500),
                output={"error": failure.type, "message": failure.message},
                metadata={"traceback": failure.traceback},
            )
            span.end(end_time=_ns(now))

    def log_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        from langfuse import propagate_attributes

        name, session, tags = self._names(step)
        finished = float(metrics.get("time") or time.time())
        started = finished - float(metrics.get("step_seconds") or 0.0)
        numbers = {
            k: v
            for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        with propagate_attributes(
            trace_name=f"{name}/train",
            session_id=session,
            tags=[*tags, "train-step"],
            metadata={"training_step": str(step), "event": _short(metrics.get("event"))},
        ):
            span = self._span(
                "span",
                "train-step",
                started,
                None,
                input={"rollouts": metrics.get("rollouts"), "groups": metrics.get("groups")},
                output=numbers,
                metadata=dict(metrics),
            )
            span.end(end_time=_ns(finished))
        for key in STEP_SCORES:
            if key in numbers:
                self._client.create_score(
                    name=key,
                    value=float(numbers[key]),
                    trace_id=span.trace_id,
                    data_type="NUMERIC",
                    score_id=f"{span.trace_id}-{key}",
                )
