"""The chat model a LangGraph app is handed: `ChatOpenAI` pointed at the policy endpoint.

Nothing about the graph changes. The model's httpx clients (async and sync) stamp every
request with the id of the rollout scope it runs in, and the gateway records the exchange
under that id, server side; so `bind_tools`, `with_structured_output`, streaming, retries,
fallbacks and nested sub-graphs are captured without this module knowing about any of
them. A `TrainableModel` is addressed by its plain name, which the gateway routes to the
latest step, so a graph built once keeps sampling from the newest LoRA after every
`train()`. Any other `Model` (a hosted supervisor, the frozen base weights) is not
recorded by default, so only the policy's calls are trained.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlcoach import Model, TrainableModel
from rlcoach.errors import MissingDependencyError, UsageError

if TYPE_CHECKING:
    from langchain_openai import ChatOpenAI

__all__ = ["chat_model"]


def chat_model(model: Model, *, record: bool | None = None, **options: Any) -> ChatOpenAI:
    """A `langchain_openai.ChatOpenAI` for `model`.

    `record` defaults to True for a `TrainableModel` (its calls become trajectories) and
    False for any other model. `options` go to `ChatOpenAI` unchanged (`temperature`,
    `max_tokens`, `stop`, `model_kwargs`, ...); the policy samples at temperature 1.0
    unless told otherwise, because GRPO learns from the spread within a group.
    """
    try:
        from langchain_openai import ChatOpenAI
    except ImportError as e:
        raise MissingDependencyError(
            f"rlcoach.integrations.langgraph needs langchain-openai, which is not installed "
            f"({e}); fix: pip install 'rlcoach[langgraph]'"
        ) from e
    trained = isinstance(model, TrainableModel)
    if record is None:
        record = trained
    if trained:
        options.setdefault("temperature", 1.0)
    for reserved in ("base_url", "api_key", "http_client", "http_async_client"):
        if reserved in options:
            raise UsageError(
                f"chat_model() sets {reserved!r} itself (it is what routes calls to "
                f"{model.name!r} and records them); drop it, or configure the Model instead"
            )
    options.setdefault("max_retries", model.max_retries)
    options.setdefault("timeout", model.timeout_s)
    return ChatOpenAI(
        model=model.name if trained else model.served_name,
        base_url=model.api_base,
        api_key=model.api_key,
        http_async_client=model.http_client(record=record),
        http_client=model.sync_http_client(record=record),
        use_responses_api=False,  # the policy endpoint speaks chat completions
        **options,
    )
