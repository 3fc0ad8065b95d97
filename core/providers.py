"""Hosted models named `provider/model`, as LiteLLM and ART write them ("openai/gpt-4.1").

A judge or a teacher is any OpenAI-compatible endpoint (`Model`). Naming one by a
`provider/model` string picks the provider's OpenAI-compatible base URL and reads its key
from the provider's usual environment variable when a request is made (never stored):

| provider | base URL | key |
|---|---|---|
| openai | https://api.openai.com/v1 (or `$OPENAI_BASE_URL`) | OPENAI_API_KEY |
| anthropic | https://api.anthropic.com/v1/ (its OpenAI-compatible endpoint) | ANTHROPIC_API_KEY |
| openrouter | https://openrouter.ai/api/v1 | OPENROUTER_API_KEY |
| gemini | https://generativelanguage.googleapis.com/v1beta/openai/ | GEMINI_API_KEY |
| groq, together_ai, fireworks_ai, deepseek, mistral, xai, cerebras | theirs | `<NAME>_API_KEY` |

The model name sent is everything after the first `/` ("openrouter/google/gemini-2.5-pro"
asks OpenRouter for "google/gemini-2.5-pro"). Anything else is a `Model(name,
base_url=..., api_key_env=...)`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rlcoach.errors import ConfigError
from rlcoach.model import Model

__all__ = ["PROVIDERS", "Provider", "as_model", "provider_model"]


@dataclass(frozen=True, slots=True)
class Provider:
    """Where a provider's OpenAI-compatible API lives and which variable holds its key."""

    base_url: str
    api_key_env: str
    base_url_env: str | None = None
    """A variable that, when set, replaces `base_url` (the provider SDK's own)."""


PROVIDERS: dict[str, Provider] = {
    "openai": Provider("https://api.openai.com/v1", "OPENAI_API_KEY", "OPENAI_BASE_URL"),
    "anthropic": Provider("https://api.anthropic.com/v1/", "ANTHROPIC_API_KEY"),
    "openrouter": Provider("https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
    "gemini": Provider(
        "https://generativelanguage.googleapis.com/v1beta/openai/", "GEMINI_API_KEY"
    ),
    "groq": Provider("https://api.groq.com/openai/v1", "GROQ_API_KEY"),
    "together_ai": Provider("https://api.together.xyz/v1", "TOGETHER_API_KEY"),
    "fireworks_ai": Provider("https://api.fireworks.ai/inference/v1", "FIREWORKS_API_KEY"),
    "deepseek": Provider("https://api.deepseek.com/v1", "DEEPSEEK_API_KEY"),
    "mistral": Provider("https://api.mistral.ai/v1", "MISTRAL_API_KEY"),
    "xai": Provider("https://api.x.ai/v1", "XAI_API_KEY"),
    "cerebras": Provider("https://api.cerebras.ai/v1", "CEREBRAS_API_KEY"),
}


def provider_model(spec: str, *, timeout_s: float = 600.0, max_retries: int = 2) -> Model:
    """The `Model` for a `provider/model` string such as "openai/gpt-4.1"."""
    provider_name, _, name = spec.partition("/")
    provider = PROVIDERS.get(provider_name.lower())
    if provider is None or not name:
        known = ", ".join(sorted(PROVIDERS))
        raise ConfigError(
            f"model {spec!r} is not a `provider/model` name rlcoach knows (providers: "
            f"{known}); fix: write e.g. 'openai/gpt-4.1', or build the model yourself: "
            f"Model({name or spec!r}, base_url='https://host/v1', api_key_env='MY_API_KEY')"
        )
    base_url = (provider.base_url_env and os.environ.get(provider.base_url_env)) or (
        provider.base_url
    )
    return Model(
        name,
        base_url=base_url,
        api_key_env=provider.api_key_env,
        timeout_s=timeout_s,
        max_retries=max_retries,
    )


def as_model(model: Model | str) -> Model:
    """A `Model` as it is, or one named by a `provider/model` string."""
    if isinstance(model, Model):
        return model
    if isinstance(model, str):
        return provider_model(model)
    raise ConfigError(
        f"{model!r} is neither a Model nor a 'provider/model' string; fix: pass e.g. "
        "'openai/gpt-4.1' or Model('name', base_url=..., api_key_env=...)"
    )
