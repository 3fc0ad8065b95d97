"""A single-turn verifiers environment as its users write one: sums, a parser, a rubric
with a per-rollout reward, a format reward and a group-level reward function."""

import verifiers as vf
from datasets import Dataset


def _rows(pairs):
    return [
        {"question": f"What is {a} + {b}? Reply with the number only.", "answer": str(a + b)}
        for a, b in pairs
    ]


def load_environment(n: int = 8, eval_n: int = 4) -> vf.Environment:
    train = Dataset.from_list(_rows([(i, i + 1) for i in range(1, n + 1)]))
    held_out = Dataset.from_list(_rows([(10 * i, 3) for i in range(1, eval_n + 1)]))
    parser = vf.Parser()

    def correct(completion, answer, **kwargs) -> float:
        return float(answer in (parser.parse_answer(completion) or ""))

    def brief(completion, **kwargs) -> float:
        return 1.0 - min(len(parser.parse_answer(completion) or ""), 100) / 100

    def distinct(completions, **kwargs) -> list[float]:
        """A group-level reward: 1 for an answer no other attempt gave."""
        texts = [parser.parse_answer(c) or "" for c in completions]
        return [float(texts.count(t) == 1) for t in texts]

    rubric = vf.Rubric(funcs=[correct, brief, distinct], weights=[1.0, 0.2, 0.1], parser=parser)
    return vf.SingleTurnEnv(dataset=train, eval_dataset=held_out, parser=parser, rubric=rubric)
