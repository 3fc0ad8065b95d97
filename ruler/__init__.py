"""RULER: group-relative LLM-judge rewards (`rlcoach.ruler`). Imports only `rlcoach`."""

__all__: list[str] = []
