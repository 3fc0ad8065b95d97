"""Email search (ART•E style): answer questions from a mailbox with FTS5 search tools.

    .venv/bin/python examples/email_search/train.py                   # CPU budget, minutes
    .venv/bin/python examples/email_search/train.py --steps 100 --group-size 16 \\
        --tasks-per-step 8 --max-turns 8 --base-model /models/Qwen3-4B   # a GPU budget

The agent gets a question ("What gate does my flight to Oslo leave from?") and two tools
over a generated mailbox in SQLite (`mailbox.py`): `search_emails` (FTS5, BM25 order) and
`read_email`. Each turn goes through the policy's OpenAI-compatible endpoint with
`tools=`, inside a `model.rollout(...)` scope, so every sampled token is recorded; a
reply without a tool call is the final answer. The reward is tiered: the right answer,
from the right source (the email that holds it was read), in few turns, with partial
credit for reading or finding the right email. One worked example in the prompt (search,
read, answer, on an email no question asks about) shows the bundled 135M model the
calls; held-out questions are about emails that training never asks about.

The bundled model still never makes a valid call from the prompt alone (reward 0 for
every attempt: GRPO has nothing to compare), so by default one SFT step on scripted
demonstrations of the training questions (`--warmup-examples`, 0 for RL alone) comes
first, and RL starts from a policy that sometimes succeeds.
"""

import asyncio
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from email_search.mailbox import TOOLS, Mailbox, Question, Trace, answer_right, call_tool, generate
from email_search.mailbox import reward as tiered_reward
from gallery import loop

from rlcoach.trajectory.trajectories import ChatRecord, tool_message

SYSTEM = (
    "You answer questions about the user's emails. Search the mailbox with "
    "search_emails, read the best match with read_email, then answer in one short "
    "sentence."
)


def worked_example(mailbox: Mailbox, question: Question) -> list[dict]:
    """search -> read -> answer on `question`, with the mailbox's real tool results."""
    trace = Trace()
    calls = [
        ("search_emails", f'{{"query": "{question.keywords}"}}'),
        ("read_email", f'{{"id": {question.email_id}}}'),
    ]
    messages: list[dict] = [{"role": "user", "content": question.text}]
    for n, (name, arguments) in enumerate(calls):
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{n}",
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }
                ],
            }
        )
        messages.append(
            {
                "role": "tool",
                "tool_call_id": f"call_{n}",
                "content": call_tool(mailbox, name, arguments, trace),
            }
        )
    assert question.email_id in trace.found, "the example's search must find its email"
    messages.append({"role": "assistant", "content": f"The answer is {question.answer}."})
    return messages


def make_expert(mailbox: Mailbox, example: list[dict]):
    """A demonstration for the SFT warm-up: the rollout's prompt, then search -> read ->
    answer on the question, with the mailbox's real tool results."""

    def expert(question: Question) -> ChatRecord:
        messages = [
            {"role": "system", "content": SYSTEM},
            *example,
            *worked_example(mailbox, question),
        ]
        return ChatRecord(messages=messages, tools=TOOLS)

    return expert


def make_attempt(mailbox: Mailbox, example: list[dict], max_turns: int, max_tokens: int):
    async def attempt(model, client, question: Question):
        trace = Trace()
        final_text, turns = None, 0
        async with model.rollout(email=question.email_id) as rollout:
            messages = [
                {"role": "system", "content": SYSTEM},
                *example,
                {"role": "user", "content": question.text},
            ]
            for _ in range(max_turns):
                reply = await client.chat.completions.create(
                    model=model.served_name,
                    messages=messages,
                    tools=TOOLS,
                    max_tokens=max_tokens,
                    temperature=1.0,
                )
                turns += 1
                message = reply.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    final_text = message.content
                    break
                for call in message.tool_calls:
                    result = call_tool(mailbox, call.function.name, call.function.arguments, trace)
                    # call_tool answers a bad call with "error: <problem>" for the policy to
                    # read; the flag is what rlcoach counts as a failed call.
                    failed = result.startswith("error:")
                    messages.append(tool_message(call.id, result, error=failed))
            rollout.reward = tiered_reward(question, trace, final_text, turns)
            right = answer_right(question, final_text)
            rollout.metrics["success"] = float(right and question.email_id in trace.read)
            rollout.metrics["right_answer"] = float(right)
            rollout.metrics["right_source"] = float(question.email_id in trace.read)
            rollout.metrics["turns"] = float(turns)
            rollout.log(f"final answer {final_text!r}; expected {question.answer!r}")
        return rollout.trajectory

    return attempt


def main() -> None:
    parser = loop.parser(
        __doc__.splitlines()[0],
        steps=4,
        tasks_per_step=3,
        group_size=4,
        eval_tasks=12,
        eval_samples=2,
        warmup_examples=23,
    )
    parser.add_argument("--max-turns", type=int, default=4, help="policy calls per question")
    parser.add_argument("--max-tokens", type=int, default=48, help="tokens per policy call")
    args = parser.parse_args()
    emails, questions = generate(args.seed)
    mailbox = Mailbox.create(
        Path(args.root) / "email-search" / f"mailbox-{args.seed}.sqlite3", emails
    )
    example_question, *rest = questions
    random.Random(args.seed).shuffle(rest)
    held_out, training = rest[: args.eval_tasks], rest[args.eval_tasks :]
    example = worked_example(mailbox, example_question)
    try:
        asyncio.run(
            loop.run(
                args,
                name="email-search",
                title="Email search over an FTS5 mailbox (GRPO)",
                attempt=make_attempt(mailbox, example, args.max_turns, args.max_tokens),
                training=training,
                held_out=held_out,
                expert=make_expert(mailbox, example),
            )
        )
    finally:
        mailbox.close()


if __name__ == "__main__":
    main()
