"""The transformers engine: the same protocol as vLLM, in-process, with an instant start.

It exists for fast tests, for the smallest setups, and as the reference that vLLM's
logprobs are checked against. Requests run one at a time in a worker thread (a lock
serialises them; the CPU has no spare cores for two). The logprob of each sampled token
is taken from the raw logits (temperature 1, no top-p), which is what vLLM reports by
default and what the trainer recomputes. It has no constrained decoding (`response_format`
and forced tool choices are not enforced) and streams a finished completion as chunk
events, not token by token.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rlcoach.engines.base import EngineHTTPError
from rlcoach.engines.stream import completion_events
from rlcoach.models.chat_template import parse_tool_calls
from rlcoach.runtime.hardware import fast_bf16

__all__ = ["TransformersEngine"]

logger = logging.getLogger(__name__)


def _bad_request(message: str, param: str | None = None) -> EngineHTTPError:
    return EngineHTTPError(
        400, {"error": {"message": message, "type": "invalid_request_error", "param": param}}
    )


class TransformersEngine:
    """Serve a base model and peft adapters with `transformers.generate`."""

    def __init__(
        self,
        model_path: str | Path,
        base_name: str,
        *,
        max_model_len: int = 4096,
        chat_template: str | None = None,
        dtype: str = "auto",
    ) -> None:
        self.model_path = Path(model_path)
        self.base_name = base_name
        self.max_model_len = max_model_len
        self._chat_template = chat_template
        self._dtype = dtype
        self._lock = threading.Lock()
        self._adapters: set[str] = set()
        self._model: Any = None
        self._tokenizer: Any = None

    async def start(self) -> None:
        await asyncio.to_thread(self._load)

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dtype: Any = getattr(torch, self._dtype) if self._dtype != "auto" else "auto"
        if dtype == "auto" and not torch.cuda.is_available() and not fast_bf16("cpu"):
            dtype = torch.float32  # a bf16 checkpoint would run on a slow fallback kernel
        self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        if self._chat_template is not None:
            self._tokenizer.chat_template = self._chat_template
        self._model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype)
        self._model.eval()

    async def healthy(self) -> bool:
        return self._model is not None

    async def load_adapter(self, served_name: str, path: Path) -> None:
        await asyncio.to_thread(self._load_adapter, served_name, Path(path))

    def _load_adapter(self, served_name: str, path: Path) -> None:
        with self._lock:
            if served_name in self._adapters:
                self._model.delete_adapter(served_name)
            self._model.load_adapter(str(path), adapter_name=served_name)
            self._adapters.add(served_name)

    async def unload_adapter(self, served_name: str) -> None:
        def unload() -> None:
            with self._lock:
                if served_name in self._adapters:
                    self._model.delete_adapter(served_name)
                    self._adapters.discard(served_name)

        await asyncio.to_thread(unload)

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        name = body.get("model")
        if name != self.base_name and name not in self._adapters:
            raise EngineHTTPError(
                404,
                {"error": {"message": f"model {name!r} is not loaded", "type": "not_found"}},
            )
        return await asyncio.to_thread(self._chat, body)

    async def chat_stream(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        response = await self.chat({k: v for k, v in body.items() if k != "stream"})
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        for event in completion_events(response, include_usage):
            data = event[len(b"data: ") :].strip()
            if data != b"[DONE]":
                yield json.loads(data)

    async def token_logprobs(self, model: str, token_ids: list[int], start: int) -> list[float]:
        def score() -> list[float]:
            import torch

            with self._lock:
                self._select(model)
                with torch.inference_mode():
                    logits = self._model(torch.tensor([token_ids])).logits[0].float()
            logprobs = torch.log_softmax(logits[:-1], dim=-1)
            targets = torch.tensor(token_ids[1:])
            values = logprobs.gather(-1, targets[:, None])[:, 0].tolist()
            return values[start - 1 :] if start > 0 else [0.0, *values]

        return await asyncio.to_thread(score)

    async def detokenize(self, model: str, token_ids: list[int]) -> str:
        return str(self._tokenizer.decode(token_ids))

    def _select(self, model: str) -> None:
        """Point the model at `model`'s adapter (or none for the base); hold the lock."""
        if model == self.base_name:
            if self._adapters:
                self._model.disable_adapters()
        else:
            self._model.set_adapter(model)
            self._model.enable_adapters()

    def _chat(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt_ids = self._prompt_ids(body)
        room = self.max_model_len - len(prompt_ids)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or room
        if room <= 0 or max_tokens > room:
            raise _bad_request(
                f"the prompt has {len(prompt_ids)} tokens and {max_tokens} more were asked for, "
                f"over the context of {self.max_model_len}; shorten the prompt or max_tokens",
                "max_tokens",
            )
        n = int(body.get("n") or 1)
        completions, logprobs_S_N_V = self._generate(body, prompt_ids, int(max_tokens), n)
        choices = [
            self._choice(body, index, completions[index].tolist(), logprobs_S_N_V, int(max_tokens))
            for index in range(n)
        ]
        completion_tokens = sum(len(choice["token_ids"]) for choice in choices)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": choices,
            "prompt_token_ids": list(prompt_ids),
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt_ids) + completion_tokens,
            },
        }

    def _prompt_ids(self, body: dict[str, Any]) -> list[int]:
        """The request's messages (and tools) through the chat template, as token ids."""
        try:
            prompt_ids = self._tokenizer.apply_chat_template(
                body["messages"],
                tools=body.get("tools") or None,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        except Exception as e:
            raise _bad_request(f"the messages do not fit the chat template: {e}", "messages") from e
        if prompt_ids and isinstance(prompt_ids[0], list):
            prompt_ids = prompt_ids[0]
        return prompt_ids

    def _generate(
        self, body: dict[str, Any], prompt_ids: list[int], max_tokens: int, n: int
    ) -> tuple[Any, Any]:
        """`n` completions of the prompt (token ids [N, S]) and every position's log-probs
        [S, N, V], sampled as the request asks (temperature, top_p, seed, stop)."""
        import torch

        temperature = body.get("temperature")
        temperature = 1.0 if temperature is None else float(temperature)
        top_p = float(body.get("top_p") or 1.0)
        eos_id = self._tokenizer.eos_token_id
        with self._lock:
            self._select(body["model"])
            if body.get("seed") is not None:
                torch.manual_seed(int(body["seed"]))
            input_ids = torch.tensor([prompt_ids])
            sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p}
            if temperature == 0.0:
                sampling = {"do_sample": False}
            with torch.inference_mode():
                out = self._model.generate(
                    input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    max_new_tokens=max_tokens,
                    num_return_sequences=n,
                    eos_token_id=eos_id,
                    pad_token_id=eos_id,
                    output_logits=True,
                    return_dict_in_generate=True,
                    stop_strings=body.get("stop") or None,
                    tokenizer=self._tokenizer,
                    top_k=0,
                    **sampling,
                )
            logits_S_N_V = torch.stack(out.logits, dim=0).float()
        return out.sequences[:, len(prompt_ids) :], torch.log_softmax(logits_S_N_V, dim=-1)

    def _choice(
        self,
        body: dict[str, Any],
        index: int,
        ids: list[int],
        logprobs_S_N_V: Any,
        max_tokens: int,
    ) -> dict[str, Any]:
        """One sampled completion as an OpenAI choice with token ids and log-probs (tool
        calls parsed where the request offered tools)."""
        eos_id = self._tokenizer.eos_token_id
        if eos_id in ids:
            ids = ids[: ids.index(eos_id) + 1]
            finish = "stop"
        else:
            finish = "length" if len(ids) >= max_tokens else "stop"
        logprobs = [float(logprobs_S_N_V[s, index, t]) for s, t in enumerate(ids)]
        text = self._tokenizer.decode(ids, skip_special_tokens=True)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if (body.get("tools") or None) and body.get("tool_choice", "auto") != "none":
            content, calls = parse_tool_calls(text)
            if calls:
                message = {"role": "assistant", "content": content, "tool_calls": calls}
                finish = "tool_calls"
        top_logprobs = int(body.get("top_logprobs") or 0)
        return {
            "index": index,
            "message": message,
            "finish_reason": finish,
            "token_ids": ids,
            "logprobs": {
                "content": [
                    {
                        "token": self._tokenizer.decode([t]),
                        "logprob": lp,
                        "bytes": None,
                        "top_logprobs": self._top(logprobs_S_N_V[s, index], top_logprobs),
                    }
                    for s, (t, lp) in enumerate(zip(ids, logprobs, strict=True))
                ]
            },
        }

    def _top(self, logprobs_V: Any, k: int) -> list[dict[str, Any]]:
        """The `k` most likely tokens at one position, shaped like OpenAI's `top_logprobs`."""
        import torch

        if k <= 0:
            return []
        values, indices = torch.topk(logprobs_V, k)
        return [
            {"token": self._tokenizer.decode([int(i)]), "logprob": float(v), "bytes": None}
            for v, i in zip(values.tolist(), indices.tolist(), strict=True)
        ]

    async def close(self) -> None:
        self._model = None
        self._adapters.clear()
