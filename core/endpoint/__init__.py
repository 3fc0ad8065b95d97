"""The endpoint room: the OpenAI-compatible policy endpoint in front of an engine.

The ASGI app (`gateway`), which adapter answers a served name and adapter swaps
(`router`), sampling under a grammar (`constraint`) and the re-scoring of constrained
answers without it (`rescore`), and the per-rollout record of every exchange
(`recorder`).

May import: the root foundation, `runtime`, `models`, `trajectory`, `engines`.
Never imports: the trainer, rollouts, the backend or serve.
"""
