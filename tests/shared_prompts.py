"""Trajectory groups whose attempts share a prompt, and the check that the trainer's step
gives the same log-probs, loss and LoRA gradients with prefix sharing on as off
(trainer/sequences.py), for tests/unit/test_prefix_sharing.py and test_sequences.py.

The comparison runs the step's own pieces (`LoraTrainer.rows`, `row_loss_terms`, the
backward) on one trainer, once with `share_prefix` off and once on. The trainer's dtype
is this machine's (bf16 autocast where the CPU has bf16, fp32 elsewhere;
`RLCOACH_CPU_BF16` forces either), and the tolerance follows it (below). Each sampled token
carries a distinct behaviour log-prob, which is how a token is found again in the other
packing.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator

import pytest
import torch

from rlcoach import SampledChoice, Trajectory, TrajectoryGroup
from rlcoach.runtime.hardware import CPU_BF16_ENV, fast_bf16
from rlcoach.trainer.step import collect_sequences, row_loss_terms

# fp32: the same sums in another order, so rounding only (an absolute bound on each
# token's log-prob, a relative one on each gradient tensor). bf16 autocast: the shared row
# puts other shapes through the matmuls and attention, and a bf16 activation keeps 8
# significant bits, so the shared step is held against the fp32 plain step instead and
# must be about as close to it as the bf16 plain step is (`BF16_SLACK` times its error,
# plus a margin of a few bf16 ulps).
FP32_LOGPROB_ATOL = 1e-4
FP32_GRAD_RTOL = 1e-4
BF16_SLACK = 1.5
BF16_LOGPROB_MARGIN = 2e-2
BF16_GRAD_MARGIN = 1e-2


class Tokens:
    """Distinct behaviour log-probs, one per sampled token (exact in fp32)."""

    def __init__(self) -> None:
        self.count = 0

    def logprobs(self, n: int) -> list[float]:
        values = [-0.25 - (self.count + i) / 1024 for i in range(n)]
        self.count += n
        return values


def choice(prompt: list[int], sampled: list[int], tokens: Tokens) -> SampledChoice:
    return SampledChoice(
        message={"role": "assistant", "content": "x"},
        prompt_token_ids=prompt,
        token_ids=sampled,
        logprobs=tokens.logprobs(len(sampled)),
        policy="p@0",
    )


def two_turn_groups(
    prompts: list[list[int]],
    replies: list[list[list[int]]],
    tool: list[int],
    finals: list[list[int]],
) -> list[TrajectoryGroup]:
    """One group per prompt, one two-turn trajectory per reply: ask, call a tool, answer.
    The second prompt of every third trajectory renders the reply differently, so that
    trajectory becomes two sequences (the second starting with the whole prompt again)."""
    tokens = Tokens()
    groups = []
    for g, (prompt, group_replies) in enumerate(zip(prompts, replies, strict=True)):
        trajectories = []
        for i, reply in enumerate(group_replies):
            rendered = reply if i % 3 else [reply[0] + 1, *reply[1:]]
            second = [*prompt, *rendered, *tool]
            final = finals[(g + i) % len(finals)]
            choices = [choice(prompt, reply, tokens), choice(second, final, tokens)]
            trajectories.append(Trajectory(choices=choices, reward=float((g + i) % 3)))
        groups.append(TrajectoryGroup(trajectories=trajectories))
    return groups


def random_groups(seed: int, vocab: int) -> list[TrajectoryGroup]:
    """Three groups of four on random tokens: one system prompt, then a question of the
    group's own, so prompts differ between groups but share their start."""
    rng = random.Random(seed)

    def ids(low: int, high: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(rng.randint(low, high))]

    system = ids(24, 24)
    prompts = [system + ids(6, 12) for _ in range(3)]
    replies = [[ids(3, 14) for _ in range(4)] for _ in prompts]
    return two_turn_groups(prompts, replies, ids(3, 3), [ids(2, 9) for _ in range(5)])


def demo_groups(tokenizer, per_group: int) -> list[TrajectoryGroup]:
    """The CPU demo's prompts (system prompt, worked examples, the add tool) rendered by
    the bundled chat template: two questions, `per_group` attempts each."""
    from rlcoach.demo.task import ADD_TOOL, make_questions

    def render(messages) -> list[int]:
        return tokenizer.apply_chat_template(
            messages, tools=[ADD_TOOL], add_generation_prompt=True, tokenize=True, return_dict=False
        )

    def encode(text: str) -> list[int]:
        return [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]

    questions = make_questions(2, seed=3)
    prompts = [render(q.messages()) for q in questions]
    replies = [
        [
            encode(
                f'<tool_call>\n{{"name": "add", "arguments": {{"a": {q.a}, "b": {q.b + i}}}}}'
                "\n</tool_call>"
            )
            for i in range(per_group)
        ]
        for q in questions
    ]
    tool = tokenizer.encode(
        "\n<|im_start|>user\n<tool_response>\n1000\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n",
        add_special_tokens=False,
    )
    finals = [encode(f"{q.a} + {q.b} = {q.answer + i}") for q in questions for i in range(3)]
    return two_turn_groups(prompts, replies, tool, finals)


def step_parts(trainer, groups, config):
    """Log-prob of every sampled token (keyed by its behaviour log-prob), the summed loss
    and every LoRA gradient of one mini-batch, through the step's own hooks."""
    sequences, _, _ = collect_sequences(groups, config)
    normalizer = float(sum(s.sampled_tokens for s in sequences))
    trainer.model.train()
    trainer.optimizer.zero_grad(set_to_none=True)
    logprobs: dict[float, float] = {}
    loss = 0.0
    rows = trainer.rows(sequences, config)
    for row in rows:
        recorded = []
        terms = row_loss_terms(Recording(trainer, recorded), row, normalizer, config)
        terms.loss.backward()
        loss += float(terms.loss.detach())
        (new_T,) = recorded
        sampled_T = row.sampled_mask_T[1:].bool()
        for old, new in zip(
            row.old_logprobs_T[1:][sampled_T].tolist(), new_T[sampled_T].tolist(), strict=True
        ):
            logprobs[old] = new
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    tokens = sum(int(r.input_ids_T.shape[0]) for r in rows)
    return logprobs, loss, grads, tokens


class Recording:
    """The trainer's step hooks, keeping the adapter pass's log-probs for the comparison."""

    def __init__(self, trainer, recorded: list) -> None:
        self.trainer, self.recorded, self.device = trainer, recorded, trainer.device

    def row_logprobs(self, row, use_adapter: bool = True):
        logprobs_T = self.trainer.row_logprobs(row, use_adapter)
        if use_adapter:
            self.recorded.append(logprobs_T.detach())
        return logprobs_T


def perturb_adapter(trainer, seed: int) -> None:
    """Random LoRA B weights (peft starts them at zero, which zeroes A's gradient)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)


@contextlib.contextmanager
def cpu_dtype(bf16: bool) -> Iterator[None]:
    """The trainer's CPU dtype forced for a while (hardware.py reads it on every call)."""
    before = os.environ.get(CPU_BF16_ENV)
    os.environ[CPU_BF16_ENV] = "1" if bf16 else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[CPU_BF16_ENV]
        else:
            os.environ[CPU_BF16_ENV] = before


def _errors(got, want) -> tuple[float, float]:
    """Largest log-prob error, largest relative error of a gradient tensor."""
    assert got[0].keys() == want[0].keys()
    keys = sorted(want[0])
    logprob = float(
        (torch.tensor([got[0][k] for k in keys]) - torch.tensor([want[0][k] for k in keys]))
        .abs()
        .max()
    )
    grad = max(
        float((got[2][name] - g).norm() / g.norm().clamp_min(1e-12)) for name, g in want[2].items()
    )
    return logprob, grad


def assert_shared_equals_plain(trainer, groups, config) -> tuple[int, int]:
    """The shared step's log-probs, loss and gradients against the plain step's (module
    docstring: the tolerance of each dtype); returns the tokens each packing ran."""
    plain = step_parts(trainer, groups, config.model_copy(update={"share_prefix": False}))
    shared = step_parts(trainer, groups, config.model_copy(update={"share_prefix": True}))
    assert any(g.abs().sum() > 0 for n, g in plain[2].items() if "lora_A" in n)
    if not fast_bf16("cpu"):
        logprob, grad = _errors(shared, plain)
        assert logprob < FP32_LOGPROB_ATOL and grad < FP32_GRAD_RTOL, (logprob, grad)
        assert shared[1] == pytest.approx(plain[1], rel=FP32_GRAD_RTOL)
        return plain[3], shared[3]
    with cpu_dtype(bf16=False):
        reference = step_parts(trainer, groups, config.model_copy(update={"share_prefix": False}))
    plain_logprob, plain_grad = _errors(plain, reference)
    shared_logprob, shared_grad = _errors(shared, reference)
    bound = BF16_SLACK * plain_logprob + BF16_LOGPROB_MARGIN
    assert shared_logprob < bound, (shared_logprob, plain_logprob)
    assert shared_grad < BF16_SLACK * plain_grad + BF16_GRAD_MARGIN, (shared_grad, plain_grad)
    loss_error = BF16_SLACK * abs(plain[1] - reference[1]) + BF16_GRAD_MARGIN * abs(reference[1])
    assert abs(shared[1] - reference[1]) <= loss_error
    return plain[3], shared[3]
