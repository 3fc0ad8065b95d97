"""Environments that go wrong on purpose, as users' environments do: `load_environment`
raises (`fail="load"`), a rollout raises inside the environment's own code for one
question in three (`fail="rollout"`), or a reward function returns NaN (`fail="nan"`)."""

import math

import verifiers as vf
from datasets import Dataset


class FlakyEnv(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        if state["answer"] == "boom":
            raise ValueError("the environment's simulator crashed on this question")
        return [{"role": "user", "content": "Say it again."}]


def load_environment(fail: str = "rollout") -> vf.Environment:
    if fail == "load":
        raise FileNotFoundError("tasks.jsonl: the environment's data file is missing")
    rows = [{"question": "Say hello.", "answer": a} for a in ("ok", "boom", "ok")]

    def reward(completion, **kwargs) -> float:
        return math.nan if fail == "nan" else float(len(completion))

    return FlakyEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[reward]), max_turns=2)
