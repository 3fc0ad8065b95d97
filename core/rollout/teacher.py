"""On-policy distillation's scorer: a teacher's log-prob of every token the student sampled.

    teacher = Teacher("calculator@8")            # an adapter served by the same engine
    result = await student.train(groups, teacher=teacher, config={"reward_coef": 0.0})

The student samples through the policy endpoint as in RL (exact token ids and the
sampler's log-probs, per rollout); `Teacher.score` asks the teacher for its log-prob of
each of those tokens and writes them on the choices (`SampledChoice.teacher_logprobs`);
the trainer then gives each token the advantage `teacher_coef * (teacher - sampler)`
(minus the per-token reverse KL, objective.py), plus `reward_coef` x the group-relative
reward advantage. Same capture, trainer and publish as RL: only the advantages differ.
(Not to be confused with `collect_demonstrations`/`distill` in backend/distill.py:
off-policy distillation, where a teacher's own good attempts become SFT data.)

Where the teacher runs:
- a served name (`"name@step"`, or the base model's name) on the student's own policy
  endpoint: a trained adapter of the same base, the cheapest case. The endpoint answers
  `/v1/completions` with `prompt_logprobs` for any name it serves (endpoint/scoring.py).
- any OpenAI-compatible server that returns prompt log-probs of token ids (vLLM's
  `/v1/completions` with `prompt_logprobs`): `Teacher(Model(...), tokenizer=...)`, a
  larger model of the same tokenizer family.

How a trajectory is scored: each history's calls are walked as the trainer walks them
(trainer/sequences.py): a call whose prompt extends the sequence so far continues it, so
a multi-turn conversation is one request; every choice's sampled tokens (only the
model's own: prompts and tool results are context) get the teacher's log-prob at their
position. A teacher must read token ids as the student does: one whose vocabulary
differs is refused, with the ids that differ, before anything is scored
(`Teacher.check`; `run_pipeline(..., teacher=)` calls it before sampling).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from rlcoach.errors import ConfigError, EngineError
from rlcoach.trajectory.trajectories import SampledChoice, Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from rlcoach.model import Model

__all__ = ["Teacher", "TeacherScores", "tokenizer_mismatch"]

REVERSE_KL_METRIC = "teacher_reverse_kl"
"""The trajectory metric a scoring writes: the mean of sampler - teacher log-prob over
its scored tokens (the reverse KL to the teacher, estimated on the student's sample)."""


@dataclass(frozen=True, slots=True)
class TeacherScores:
    """What one `Teacher.score` did."""

    trajectories: int
    tokens: int
    """Sampled tokens the teacher scored."""
    requests: int
    reverse_kl: float
    """Mean of (sampler - teacher) log-prob per scored token: 0 when the teacher agrees."""
    seconds: float


def _tokenizer_folder(name: str | Path) -> Path:
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    from rlcoach.models.base_model import resolve_base_model

    return resolve_base_model(str(name))


def _vocab(folder: Path) -> dict[str, int]:
    from transformers import AutoTokenizer

    return dict(AutoTokenizer.from_pretrained(folder).get_vocab())


def tokenizer_mismatch(student: str | Path, teacher: str | Path) -> str | None:
    """Why `teacher`'s token ids mean something else than `student`'s (each a model folder,
    a tokenizer folder, a shipped name or a hub id), or None when the vocabularies agree."""
    student_path, teacher_path = _tokenizer_folder(student), _tokenizer_folder(teacher)
    if student_path.resolve() == teacher_path.resolve():
        return None
    ours, theirs = _vocab(student_path), _vocab(teacher_path)
    if ours == theirs:
        return None
    by_id = {i: t for t, i in theirs.items()}
    differ = sorted(i for t, i in ours.items() if by_id.get(i) != t)
    extra = len(set(theirs.values()) - set(ours.values()))
    shown = ", ".join(f"{i}: {next(t for t, j in ours.items() if j == i)!r}" for i in differ[:3])
    return (
        f"the student's vocabulary ({len(ours)} tokens) and the teacher's ({len(theirs)}) "
        f"differ: {len(differ)} of the student's ids name another token or none in the "
        f"teacher's (e.g. {shown}), and the teacher has {extra} ids the student lacks"
    )


class Teacher:
    """Scores the student's sampled tokens with another model's log-probs (module doc).

    `model`: a served name on the student's own policy endpoint (`"name@step"`, or the
    base model's name), or a `Model` for an OpenAI-compatible server that answers
    `/v1/completions` with `prompt_logprobs` (vLLM does); that one needs `tokenizer`,
    the teacher's tokenizer (a folder, a shipped name or a hub id), to be compared with
    the student's before anything is scored."""

    def __init__(
        self,
        model: str | Model,
        *,
        tokenizer: str | Path | None = None,
        max_concurrency: int = 8,
        timeout_s: float = 600.0,
    ) -> None:
        if not isinstance(model, str) and tokenizer is None:
            raise ConfigError(
                f"Teacher({model.name!r}) runs on another server, so its token ids cannot be "
                "assumed to be the student's; fix: pass tokenizer= the teacher's tokenizer "
                "(a folder, or its hub id) so the two vocabularies are compared"
            )
        if max_concurrency < 1:
            raise ConfigError(f"max_concurrency={max_concurrency!r} must be >= 1")
        self.model = model
        self.tokenizer = tokenizer
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self._checked: set[str] = set()

    @property
    def name(self) -> str:
        """The name sent as the request's `model`."""
        return self.model if isinstance(self.model, str) else self.model.name

    def check(self, student: Model) -> None:
        """Refuse a teacher whose token ids mean something else than the student's."""
        base = getattr(student, "base_model", None)
        if self.tokenizer is None or base is None or base in self._checked:
            return  # a name on the student's own engine: the same base, the same tokenizer
        problem = tokenizer_mismatch(base, self.tokenizer)
        if problem is not None:
            raise ConfigError(
                f"teacher {self.name!r} does not share student {student.name!r}'s tokenizer "
                f"({base}): {problem}; on-policy distillation scores the student's exact "
                "token ids, which would be read as other tokens. Fix: pick a teacher of the "
                "same tokenizer family (a larger model of the student's family, or an "
                "adapter of the student's base, served as `name@step`), or off-policy "
                "distillation (`rlcoach.backend.distill`), which trains on the teacher's text"
            )
        self._checked.add(base)

    async def score(self, student: Model, groups: list[TrajectoryGroup]) -> TeacherScores:
        """Write the teacher's log-prob of every sampled token of `groups` on its choice
        (`SampledChoice.teacher_logprobs`) and each trajectory's reverse KL metric."""
        await asyncio.to_thread(self.check, student)
        started = time.perf_counter()
        trajectories = [t for g in groups for t in g.trajectories]
        url, key = self._endpoint(student)
        limit = asyncio.Semaphore(self.max_concurrency)
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=headers) as client:

            async def one(ids: list[int]) -> list[float]:
                async with limit:
                    return await self._logprobs(client, url, ids)

            per_trajectory = await asyncio.gather(
                *(self._score_trajectory(t, one) for t in trajectories)
            )
        tokens = sum(n for n, _, _ in per_trajectory)
        gap = sum(g for _, g, _ in per_trajectory)
        return TeacherScores(
            trajectories=len(trajectories),
            tokens=tokens,
            requests=sum(r for _, _, r in per_trajectory),
            reverse_kl=gap / tokens if tokens else 0.0,
            seconds=time.perf_counter() - started,
        )

    def _endpoint(self, student: Model) -> tuple[str, str]:
        owner = student if isinstance(self.model, str) else self.model
        return owner.api_base.rstrip("/") + "/completions", owner.api_key

    async def _score_trajectory(self, trajectory: Trajectory, one: Any) -> tuple[int, float, int]:
        """(tokens scored, their summed sampler - teacher gap, requests) of `trajectory`."""
        tokens, gap, requests = 0, 0.0, 0
        for history in [trajectory.choices, *(h.choices for h in trajectory.additional_histories)]:
            for ids, placed in _sequences(history):
                values = await one(ids)
                requests += 1
                for choice, start in placed:
                    scored = values[start - 1 : start - 1 + len(choice.token_ids)]
                    choice.teacher_logprobs = scored
                    known = [(s, t) for s, t in zip(choice.logprobs, scored, strict=True) if s == s]
                    tokens += len(known)
                    gap += sum(s - t for s, t in known)
        if tokens:
            trajectory.metrics[REVERSE_KL_METRIC] = gap / tokens
        return tokens, gap, requests

    async def _logprobs(self, client: httpx.AsyncClient, url: str, ids: list[int]) -> list[float]:
        """The teacher's log-prob of each of `ids[1:]` given the ids before it."""
        body = {"model": self.name, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0}
        try:
            response = await client.post(url, json=body)
        except httpx.HTTPError as e:
            raise EngineError(f"teacher {self.name!r} at {url} did not answer: {e!r}") from e
        if response.status_code != 200:
            raise EngineError(
                f"teacher {self.name!r} at {url} refused to score {len(ids)} token ids "
                f"(HTTP {response.status_code}): {response.text[:300]}; fix: serve the teacher "
                "where `/v1/completions` answers `prompt_logprobs` (the policy endpoint, vLLM)"
            )
        positions = response.json()["choices"][0].get("prompt_logprobs")
        if not positions or len(positions) != len(ids):
            raise EngineError(
                f"teacher {self.name!r} at {url} returned no prompt log-probs for "
                f"{len(ids)} token ids; fix: a server that honours `prompt_logprobs` (vLLM)"
            )
        return [
            float(entry[str(token)]["logprob"])
            for token, entry in zip(ids[1:], positions[1:], strict=True)
        ]


def _sequences(choices: list[SampledChoice]) -> list[tuple[list[int], list[tuple[Any, int]]]]:
    """A history's calls as the trainer walks them: each sequence's token ids and where
    each of its choices' sampled tokens start in it."""
    built: list[tuple[list[int], list[tuple[Any, int]]]] = []
    ids: list[int] = []
    placed: list[tuple[Any, int]] = []
    for choice in choices:
        prompt = choice.prompt_token_ids
        if ids and prompt[: len(ids)] == ids:
            ids = ids + list(prompt[len(ids) :])
        else:
            if ids:
                built.append((ids, placed))
            ids, placed = list(prompt), []
        placed.append((choice, len(ids)))
        ids = ids + list(choice.token_ids)
    if ids:
        built.append((ids, placed))
    return [(i, p) for i, p in built if any(c.token_ids for c, _ in p)]
