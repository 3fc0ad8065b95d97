"""The serve room: the backend over HTTP, both ends of the wire.

`rlcoach serve` (`server`, `serve_config`, `access`, `refusal`, `registrations`,
`training_requests`, `step_records`) and `RemoteBackend` (`remote`), which speak the wire
types in `wire`.

May import: every room below it, the backend included.
"""
