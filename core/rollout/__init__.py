"""The rollout room: running the user's agent code and collecting what it said.

The rollout scope (`scope`: calls made inside it become one trajectory), client-side
capture for plain models (`capture`), running many rollouts with bounded concurrency,
failures recorded and retries (`gather`), how stale a sample is (`staleness`), a
teacher's scores of the sampled tokens for on-policy distillation (`teacher`), and
off-policy distillation from a stronger model's attempts (`distill`).

May import: the root foundation, `runtime`, `models`, `trajectory`, `engines`,
`endpoint`. Never imports: the trainer, the backend or serve.
"""

from rlcoach.rollout.scope import ExchangeSource, Rollout, current_rollout_id

__all__ = ["ExchangeSource", "Rollout", "current_rollout_id"]
