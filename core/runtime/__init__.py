"""The runtime room: the machine a run lives on.

Which GPUs serve and which train (`placement`), what the processor does fast
(`hardware`), child processes that must not outlive rlcoach (`processes`), GPU memory
checks before anything loads (`memory`), the heap after a step (`heap`), and named
places where a fault can be injected on purpose (`failpoints`).

May import: the root foundation. Never imports: any other room.
"""
