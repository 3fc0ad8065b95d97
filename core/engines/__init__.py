"""Inference engines behind the policy endpoint (vLLM, transformers).

One `Engine` protocol (`base`): chat completions for a named adapter with per-token
log-probs and sampled token ids, adapters loaded and unloaded, health. vLLM's server
(`vllm`, `http`), the in-process transformers engine and its process (`transformers`,
`transformers_process`, `process`), the SSE events of streamed completions (`stream`)
and the hot path's JSON (`fastjson`).

May import: the root foundation, `runtime`, `models`. Never imports: the endpoint, the
trainer, rollouts, the backend or serve.
"""
