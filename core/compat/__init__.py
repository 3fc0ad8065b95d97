"""The compatibility room: other frameworks' idioms, and old import paths.

ART's configuration knobs translated into rlcoach's (`art_config`), ART's `art.dev`
dict types (`dev`), and the import paths of modules that moved into rooms (`moved`:
`import rlcoach.gateway` still works for one release, with a DeprecationWarning).

May import: the root foundation. Never imports: anything that serves or trains.
"""
