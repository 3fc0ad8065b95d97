"""Prompt log-probs of given token ids, for any model the policy endpoint serves.

`POST /v1/completions` with `prompt` as token ids and `prompt_logprobs` set answers as
vLLM does: `choices[0].prompt_logprobs[i]` is `{str(token_id): {"logprob": ...}}` for
each prompt position after the first (None for the first). It is what a teacher in
on-policy distillation asks of the endpoint (rollout/teacher.py): its log-probs of the
student's exact sampled tokens, under a served name (`name@step`: a trained adapter of
the same base, or the base itself). Nothing is generated and nothing is recorded; the
engine computes the log-probs from its raw logits (`Engine.token_logprobs`: no
temperature, no grammar). Where the engine must score alone (vLLM on a CPU), the
request waits until no chat is in flight, as a re-scoring does (rescore.py).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rlcoach.endpoint.rescore import RescoreGate
from rlcoach.endpoint.router import Router
from rlcoach.engines import fastjson
from rlcoach.engines.base import Engine, EngineHTTPError
from rlcoach.errors import EngineError, UnknownModelError

__all__ = ["prompt_logprobs_response"]


def _problem(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "the request body is not a JSON object"
    prompt = body.get("prompt")
    if body.get("prompt_logprobs") is None or not isinstance(body.get("model"), str):
        return (
            "this endpoint's /v1/completions only scores token ids: give `model`, `prompt` "
            "as a list of token ids and `prompt_logprobs` (0 is enough); to generate, use "
            "/v1/chat/completions"
        )
    if (
        not isinstance(prompt, list)
        or len(prompt) < 2
        or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return f"`prompt` must be a list of at least 2 token ids, not {str(prompt)[:80]}"
    return None


def _error(status: int, message: str, code: str | None = None) -> JSONResponse:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return JSONResponse({"error": error}, status_code=status)


async def prompt_logprobs_response(
    request: Request, router: Router, engine: Engine, gate: RescoreGate
) -> Response:
    """Answer a prompt-log-probs request (the module docstring)."""
    try:
        body = fastjson.loads(await request.body())
    except (ValueError, UnicodeDecodeError) as e:
        return _error(400, f"the request body is not valid JSON: {e}")
    problem = _problem(body)
    if problem is not None:
        return _error(400, problem)
    prompt: list[int] = body["prompt"]
    try:
        served, engine_name = await router.acquire(body["model"])
    except UnknownModelError as e:
        return _error(404, str(e), "model_not_found")
    except EngineError as e:
        return _error(503, str(e))
    try:
        async with gate.alone():
            values = await engine.token_logprobs(engine_name, prompt, 1)
    except EngineHTTPError as e:
        return JSONResponse(e.body, status_code=e.status)
    except EngineError as e:
        return _error(503, str(e))
    finally:
        await router.release(engine_name)
    positions: list[dict[str, Any] | None] = [None]
    positions += [
        {str(token): {"logprob": value}} for token, value in zip(prompt[1:], values, strict=True)
    ]
    choice = {"index": 0, "text": "", "finish_reason": "length", "prompt_logprobs": positions}
    return JSONResponse({"object": "text_completion", "model": served, "choices": [choice]})
