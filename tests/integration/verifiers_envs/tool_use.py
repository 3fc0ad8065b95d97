"""A tool verifiers environment as its users write one: plain Python functions become the
tools (`vf.ToolEnv`), the model calls them over several turns, the rubric checks the sum."""

import verifiers as vf
from datasets import Dataset

SYSTEM = (
    "You can call the tool `add`. To call it, reply with only "
    '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>. '
    "After the tool's result, reply with the number."
)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def load_environment(max_turns: int = 3) -> vf.Environment:
    rows = [
        {"question": f"What is {a} + {b}? Use the add tool.", "answer": str(a + b)}
        for a, b in ((12, 30), (7, 8), (21, 4), (100, 5))
    ]
    parser = vf.Parser()

    def correct(completion, answer, **kwargs) -> float:
        return float(answer in (parser.parse_answer(completion) or ""))

    rubric = vf.Rubric(funcs=[correct], parser=parser)
    return vf.ToolEnv(
        dataset=Dataset.from_list(rows[:2]),
        eval_dataset=Dataset.from_list(rows[2:]),
        tools=[add],
        system_prompt=SYSTEM,
        rubric=rubric,
        max_turns=max_turns,
    )
