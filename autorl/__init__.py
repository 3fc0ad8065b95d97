"""AutoRL: training inputs from a task description or tool list (`rlcoach.autorl`).

Imports only `rlcoach`.
"""

__all__: list[str] = []
