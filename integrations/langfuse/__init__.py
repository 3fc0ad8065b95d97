"""Langfuse (`rlcoach.integrations.langfuse`, extra `[langfuse]`): watch training there.

Every rollout becomes a trace (policy calls as generations, tool calls as tool spans),
every reward and RULER verdict a score with the judge's reason, every step a trace of
its own with the training metrics as scores. It is a sink plug-in (`rlcoach.observe.sinks`):
exporting the standard variables turns it on, with no code change:

    export LANGFUSE_PUBLIC_KEY=pk-lf-... LANGFUSE_SECRET_KEY=sk-lf-...
    export LANGFUSE_HOST=https://cloud.langfuse.com   # or your server (LANGFUSE_BASE_URL)

or name it: `LocalBackend(sinks={"plugins": {"langfuse": {"tags": ["exp-3"]}}})`.
Importing this package does not import the SDK; the sink loads it when it starts.
"""

from rlcoach.integrations.langfuse.sink import STEP_SCORES, LangfuseConfig, LangfuseSink, trace_id

__all__ = ["STEP_SCORES", "LangfuseConfig", "LangfuseSink", "trace_id"]
