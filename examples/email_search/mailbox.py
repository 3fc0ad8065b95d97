"""A generated mailbox in SQLite with full-text search, its two tools, and the reward.

The mailbox is a pure function of a seed: emails about flights, invoices, parcels,
dinners, appointments and passwords (one question each, with its answer written in the
body) among newsletters that answer nothing. Each topic appears with several entities
(flights to six cities, invoices from six companies, ...), so a search has to name the
entity, not only the topic, to find the right email.

SQLite's FTS5 indexes subject, sender and body. The agent has two tools, in the spirit
of ART•E: `search_emails(query)` returns the ids, senders, subjects and dates of the best
matches (BM25 order, no body text, so the answer needs a `read_email`), and
`read_email(id)` returns one whole email. The query's words are matched with OR, so a
small model's loose queries still return something to rank.

The reward is tiered (right answer, right source, fewer turns):

- right answer: 0.6, plus 0.3 when the right email was read (the right source), plus 0.1
  when it took no more than `IDEAL_TURNS` policy turns (search, read, answer);
- otherwise partial credit for the way there: 0.4 when the right email was read, 0.2
  when a search returned it, 0.1 for any well-formed tool call, 0 for none.

Success means the right answer from the right source.
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

IDEAL_TURNS = 3
SEARCH_LIMIT = 3

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search_emails",
            "description": "Full-text search over the mailbox; returns the best matching emails "
            "(id, sender, subject, date).",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_email",
            "description": "Read one email by its id.",
            "parameters": {
                "type": "object",
                "properties": {"id": {"type": "integer"}},
                "required": ["id"],
            },
        },
    },
]


@dataclass(frozen=True, slots=True)
class Email:
    id: int
    sender: str
    subject: str
    date: str
    body: str

    def text(self) -> str:
        return f"From: {self.sender}\nDate: {self.date}\nSubject: {self.subject}\n\n{self.body}"


@dataclass(frozen=True, slots=True)
class Question:
    email_id: int
    text: str
    answer: str
    keywords: str
    """A good search query (topic and entity), for worked examples."""


CITIES = ("Lisbon", "Oslo", "Vienna", "Dublin", "Porto", "Krakow")
COMPANIES = ("Brightwater", "Nordlys", "Tallpine", "Quickfix", "Greenleaf", "Copperfield")
SHOPS = ("BookNook", "GadgetHub", "PlantPal", "ShoeBox", "ToyTown", "KitchenCo")
FRIENDS = ("Maya", "Tom", "Priya", "Lukas", "Sofia", "Omar")
SERVICES = ("dentist", "hairdresser", "vet", "mechanic", "optician", "physio")
PLACES = ("office", "gym", "library", "studio", "cabin", "clubhouse")
RESTAURANTS = (
    "Casa Lupo",
    "Blue Lotus",
    "The Anchor",
    "Golden Fork",
    "Olive Tree",
    "Red Lantern",
    "Saffron House",
    "Little Havana",
)
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
NEWS = (
    "Weekly digest",
    "Your monthly statement is ready",
    "New arrivals this week",
    "Community newsletter",
    "Security tips for your account",
    "Event calendar",
)


def _time(rng: random.Random) -> str:
    return f"{rng.randint(8, 18) % 12 or 12}:{rng.choice(('00', '15', '30', '45'))} " + (
        "am" if rng.random() < 0.4 else "pm"
    )


def _code(rng: random.Random, letters: int, digits: int) -> str:
    return "".join(rng.choice("ABCDEFGHJKLMNPRSTUVWXYZ") for _ in range(letters)) + "".join(
        rng.choice("0123456789") for _ in range(digits)
    )


def _fact(topic: str, entity: str, rng: random.Random) -> tuple[str, str, str, str, str]:
    """(sender, subject, body, question, answer) for one fact email."""
    day = rng.choice(DAYS)
    if topic == "flight":
        gate = _code(rng, 1, 2)
        return (
            "bookings@skyway.example",
            f"Your flight to {entity}",
            f"Booking confirmed. Flight {_code(rng, 2, 3)} to {entity} leaves on {day} "
            f"from gate {gate}.",
            f"What gate does my flight to {entity} leave from?",
            gate,
        )
    if topic == "invoice":
        amount = f"{rng.randint(40, 900)}.{rng.choice(('00', '50', '90'))}"
        return (
            f"billing@{entity.lower()}.example",
            f"Invoice from {entity}",
            f"Your invoice from {entity} is attached. The amount due is {amount} EUR, "
            f"payable by {day}.",
            f"How much is the invoice from {entity}?",
            amount,
        )
    if topic == "parcel":
        code = _code(rng, 2, 4)
        return (
            f"shipping@{entity.lower()}.example",
            f"Your {entity} order has shipped",
            f"Good news: your {entity} parcel is on its way. Tracking code: {code}. "
            f"Expected delivery on {day}.",
            f"What is the tracking code of my {entity} parcel?",
            code,
        )
    if topic == "dinner":
        place = rng.choice(RESTAURANTS)
        return (
            f"{entity.lower()}@mail.example",
            f"Dinner on {day}?",
            f"Hi! How about dinner on {day}? I booked a table at {place}. {entity}",
            f"Which restaurant did {entity} book for dinner?",
            place,
        )
    if topic == "appointment":
        time = _time(rng)
        return (
            f"reception@{entity}.example",
            f"Your {entity} appointment",
            f"This is a reminder of your {entity} appointment on {day} at {time}.",
            f"What time is my {entity} appointment?",
            time,
        )
    if topic == "password":
        word = f"{rng.choice(('maple', 'river', 'copper', 'violet', 'ember'))}{rng.randint(10, 99)}"
        return (
            "admin@team.example",
            f"Wifi at the {entity}",
            f"The guest wifi password at the {entity} is {word}. Please do not share it.",
            f"What is the wifi password at the {entity}?",
            word,
        )
    raise ValueError(f"topic {topic!r} is unknown")


TOPICS = {
    "flight": CITIES,
    "invoice": COMPANIES,
    "parcel": SHOPS,
    "dinner": FRIENDS,
    "appointment": SERVICES,
    "password": PLACES,
}


def generate(seed: int = 0) -> tuple[list[Email], list[Question]]:
    """The mailbox's emails (ids 1..n, shuffled) and one question per fact email."""
    rng = random.Random(f"mailbox-{seed}")
    drafts: list[tuple[str, str, str, tuple[str, str, str] | None]] = []
    for topic, entities in TOPICS.items():
        for entity in entities:
            sender, subject, body, question, answer = _fact(topic, entity, rng)
            drafts.append((sender, subject, body, (question, answer, f"{topic} {entity}")))
    for title in NEWS * 2:
        drafts.append(
            (
                "news@updates.example",
                title,
                f"{title}. Read the highlights on our website. Unsubscribe any time.",
                None,
            )
        )
    rng.shuffle(drafts)
    emails, questions = [], []
    for number, (sender, subject, body, qa) in enumerate(drafts, start=1):
        date = f"2026-{rng.randint(1, 11):02d}-{rng.randint(1, 28):02d}"
        emails.append(Email(number, sender, subject, date, body))
        if qa is not None:
            questions.append(Question(number, *qa))
    return emails, questions


def fts_query(text: str) -> str:
    """An FTS5 query from free text: each word quoted (no syntax errors), joined by OR."""
    words = re.findall(r"[A-Za-z0-9]+", text)
    return " OR ".join(f'"{w}"' for w in words)


@dataclass
class Mailbox:
    """The emails in an SQLite database with an FTS5 index."""

    path: Path
    db: sqlite3.Connection = field(init=False)

    @classmethod
    def create(cls, path: str | Path, emails: list[Email]) -> Mailbox:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".tmp-{path.name}")
        temp.unlink(missing_ok=True)
        with sqlite3.connect(temp) as db:
            db.execute(
                "CREATE TABLE emails (id INTEGER PRIMARY KEY, sender TEXT, "
                "subject TEXT, date TEXT, body TEXT)"
            )
            db.execute(
                "CREATE VIRTUAL TABLE emails_fts USING fts5(sender, subject, body, "
                "content='emails', content_rowid='id')"
            )
            db.executemany(
                "INSERT INTO emails VALUES (?, ?, ?, ?, ?)",
                [(e.id, e.sender, e.subject, e.date, e.body) for e in emails],
            )
            db.execute("INSERT INTO emails_fts(emails_fts) VALUES ('rebuild')")
        db.close()
        temp.replace(path)  # atomic: a reader sees the whole mailbox or the old one
        return cls(path)

    def __post_init__(self) -> None:
        self.db = sqlite3.connect(self.path)

    def close(self) -> None:
        self.db.close()

    def search(self, query: str, limit: int = SEARCH_LIMIT) -> list[Email]:
        match = fts_query(query)
        if not match:
            return []
        rows = self.db.execute(
            "SELECT e.id, e.sender, e.subject, e.date, e.body FROM emails_fts "
            "JOIN emails e ON e.id = emails_fts.rowid WHERE emails_fts MATCH ? "
            "ORDER BY bm25(emails_fts) LIMIT ?",
            (match, limit),
        ).fetchall()
        return [Email(*row) for row in rows]

    def read(self, email_id: int) -> Email | None:
        row = self.db.execute(
            "SELECT id, sender, subject, date, body FROM emails WHERE id = ?", (email_id,)
        ).fetchone()
        return Email(*row) if row else None


@dataclass
class Trace:
    """What an agent did with the tools during one rollout, for the reward."""

    valid_calls: int = 0
    found: set[int] = field(default_factory=set)
    read: set[int] = field(default_factory=set)


def call_tool(mailbox: Mailbox, name: str, arguments: str | None, trace: Trace) -> str:
    """Run one tool call; bad calls get an error text naming the problem (and no credit)."""
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError as e:
        return f"error: the arguments are not JSON ({e.msg})"
    if not isinstance(args, dict):
        return "error: the arguments must be a JSON object"
    if name == "search_emails":
        if not isinstance(args.get("query"), str) or not args["query"].strip():
            return 'error: search_emails needs {"query": "<words>"}'
        trace.valid_calls += 1
        results = mailbox.search(args["query"])
        trace.found.update(e.id for e in results)
        if not results:
            return "no emails match"
        return "\n".join(f"id {e.id} | from {e.sender} | {e.subject} | {e.date}" for e in results)
    if name == "read_email":
        try:
            email_id = int(args["id"])
        except (KeyError, TypeError, ValueError):
            return 'error: read_email needs {"id": <integer>}'
        trace.valid_calls += 1
        email = mailbox.read(email_id)
        if email is None:
            return f"error: there is no email with id {email_id}"
        trace.read.add(email_id)
        return email.text()
    return f"error: there is no tool named {name!r}; use search_emails or read_email"


def _normal(text: str) -> str:
    return re.sub(r"\s+", "", text.lower())


def answer_right(question: Question, final_text: str | None) -> bool:
    return bool(final_text) and _normal(question.answer) in _normal(final_text)


def reward(question: Question, trace: Trace, final_text: str | None, turns: int) -> float:
    """The tiered reward (see the module docstring)."""
    source = question.email_id in trace.read
    if answer_right(question, final_text):
        return 0.6 + 0.3 * source + 0.1 * (turns <= IDEAL_TURNS)
    if source:
        return 0.4
    if question.email_id in trace.found:
        return 0.2
    return 0.1 if trace.valid_calls else 0.0
