"""A multi-turn verifiers environment as its users write one: guess a number from 1 to 9;
the environment answers "higher" or "lower" until the guess is right or turns run out."""

import re

import verifiers as vf
from datasets import Dataset

PROMPT = "I picked a number from 1 to 9. Guess it: reply with one digit."


class GuessEnv(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        guess = _guess(messages[-1].content)
        secret = int(state["answer"])
        if guess == secret:
            state["final_env_response"] = [{"role": "user", "content": "Correct!"}]
            return []
        hint = "no digit there" if guess is None else ("higher" if guess < secret else "lower")
        return [{"role": "user", "content": f"Wrong: {hint}. Guess again."}]


def _guess(text) -> int | None:
    found = re.search(r"[1-9]", text or "")
    return int(found.group()) if found else None


def load_environment(max_turns: int = 3) -> vf.Environment:
    rows = [{"question": PROMPT, "answer": str(n)} for n in (3, 5, 7, 2, 8, 4)]

    def solved(state, **kwargs) -> float:
        return float(any(_guess(m.content) == int(state["answer"]) for m in _said(state)))

    def fewer_turns(state, **kwargs) -> float:
        return 1.0 / max(1, len(state["trajectory"]))

    rubric = vf.Rubric(funcs=[solved, fewer_turns], weights=[1.0, 0.1])
    return GuessEnv(
        dataset=Dataset.from_list(rows[:4]),
        eval_dataset=Dataset.from_list(rows[4:]),
        rubric=rubric,
        max_turns=max_turns,
    )


def _said(state):
    return [m for m in state["completion"] or [] if m.role == "assistant"]
