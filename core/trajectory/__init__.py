"""The trajectory room: what a rollout produced, as data.

Trajectories and groups with the exact sampled tokens (`trajectories`), the histories
that recorded exchanges become (`histories`), a trajectory read as a timeline of policy
and tool calls (`timeline`), what a client holds after calling a model
(`client_choices`), and resumable dataset iteration (`dataset`).

May import: the root foundation (errors, validation, config, paths) and `models`.
Never imports: engines, the endpoint, the trainer, the backend or serve. One exception
is held by the layer test: awaiting a `TrajectoryGroup` of pending rollouts (ART's idiom)
runs them through `rollout.gather`, imported when awaited.
"""
