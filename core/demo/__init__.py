"""The bundled demo: a calculator tool-use task with a verifiable reward.

`rlcoach demo` trains the bundled model on it (`run`); the task, its tool and its reward
are in `task`.

May import: the public API and the rooms below it, as user code does.
"""
