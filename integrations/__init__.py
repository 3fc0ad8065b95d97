"""Adapters from agent frameworks and observability tools (`rlcoach.integrations`).

May import `rlcoach`, `rlcoach.ruler` and `rlcoach.autorl`; the core never imports it.
"""

__all__: list[str] = []
