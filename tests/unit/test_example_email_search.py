"""Email search example (examples/email_search/mailbox.py): the generated mailbox, FTS5
search, the tools' handling of bad calls, and the reward tiers."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from email_search.mailbox import (
    Mailbox,
    Question,
    Trace,
    answer_right,
    call_tool,
    fts_query,
    generate,
    reward,
)


@pytest.fixture(scope="module")
def mailbox(tmp_path_factory):
    emails, _ = generate(0)
    box = Mailbox.create(tmp_path_factory.mktemp("mail") / "box.sqlite3", emails)
    yield box
    box.close()


def test_the_mailbox_is_a_pure_function_of_the_seed_and_answers_are_in_bodies():
    emails, questions = generate(0)
    assert (emails, questions) == generate(0) and generate(1) != (emails, questions)
    by_id = {e.id: e for e in emails}
    assert len(questions) == 36 and len(emails) > len(questions)
    assert all(q.answer in by_id[q.email_id].body for q in questions)


def test_fts_query_quotes_words_so_punctuation_cannot_break_it():
    assert fts_query('flight "Oslo" OR (gate)?') == '"flight" OR "Oslo" OR "OR" OR "gate"'
    assert fts_query("?!") == ""


def test_search_ranks_the_email_with_the_entity_first(mailbox):
    _, questions = generate(0)
    for q in questions:
        assert mailbox.search(q.keywords)[0].id == q.email_id
        assert q.email_id in [e.id for e in mailbox.search(q.text)]
    assert mailbox.search("zzzz nothing") == [] and mailbox.search("") == []


def test_tools_record_what_was_found_and_read_and_explain_bad_calls(mailbox):
    _, questions = generate(0)
    q = questions[0]
    trace = Trace()
    listing = call_tool(mailbox, "search_emails", f'{{"query": "{q.keywords}"}}', trace)
    assert f"id {q.email_id} |" in listing and q.answer not in listing  # no bodies
    assert q.answer in call_tool(mailbox, "read_email", f'{{"id": {q.email_id}}}', trace)
    assert trace.valid_calls == 2 and q.email_id in trace.found and trace.read == {q.email_id}
    bad = Trace()
    assert "not JSON" in call_tool(mailbox, "read_email", "{id: 3", bad)
    assert "needs" in call_tool(mailbox, "read_email", '{"id": "three"}', bad)
    assert "needs" in call_tool(mailbox, "search_emails", '{"query": ""}', bad)
    assert "no tool named" in call_tool(mailbox, "delete_email", "{}", bad)
    assert "no email with id 999" in call_tool(mailbox, "read_email", '{"id": 999}', bad)
    assert bad.read == set() and bad.valid_calls == 1  # the unknown id was a valid call


def test_reward_tiers():
    q = Question(7, "What gate?", "B12", "flight Oslo")
    read, found, called, nothing = (
        Trace(valid_calls=2, found={7}, read={7}),
        Trace(valid_calls=1, found={7}),
        Trace(valid_calls=1),
        Trace(),
    )
    assert reward(q, read, "Gate b 12.", turns=3) == pytest.approx(1.0)  # answer, source, fast
    assert reward(q, read, "Gate B12.", turns=4) == pytest.approx(0.9)  # one turn too many
    assert reward(q, called, "B12", turns=2) == pytest.approx(0.7)  # right answer, no source
    assert reward(q, read, "Gate C3.", turns=3) == 0.4
    assert reward(q, found, None, turns=4) == 0.2
    assert reward(q, called, "no idea", turns=2) == 0.1
    assert reward(q, nothing, "B13", turns=1) == 0.0
    assert answer_right(q, "b12") and not answer_right(q, None)


def test_the_warmup_demonstrations_earn_the_full_reward(mailbox):
    """Each SFT demonstration, replayed through the tools, is a perfect rollout."""
    from email_search.train import SYSTEM, make_expert, worked_example

    _, questions = generate(0)
    example = worked_example(mailbox, questions[0])
    expert = make_expert(mailbox, example)
    for question in questions[1:]:
        record = expert(question)
        assert record.messages[0] == {"role": "system", "content": SYSTEM}
        demonstration = record.messages[1 + len(example) :]
        assert demonstration[0] == {"role": "user", "content": question.text}
        trace, turns = Trace(), 0
        for message in demonstration[1:]:
            if message["role"] != "assistant":
                continue
            turns += 1
            for call in message.get("tool_calls") or []:
                call_tool(mailbox, call["function"]["name"], call["function"]["arguments"], trace)
        assert reward(question, trace, demonstration[-1]["content"], turns) == pytest.approx(1.0)
