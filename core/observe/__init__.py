"""The observation room: where a run's trajectories and metrics go, and how they read.

Sinks (`sinks`: on disk always, Langfuse / W&B and plug-ins by choice) receive; they
never call the backend. `report` renders a run directory as one static HTML page.

May import: the root foundation, `runtime`, `models`, `trajectory`, `trainer` (the
report renders sequences as the trainer sees them). Never imports: the backend or serve.
"""
