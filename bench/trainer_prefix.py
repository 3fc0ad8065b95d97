"""The CPU demo's training step with and without prefix sharing, in one run.

The batch is the demo's (core/demo): two questions, a group of eight attempts each, every
attempt two turns (a tool call, then the answer after the tool's result), prompts rendered
by the bundled chat template from the demo's system prompt, worked examples and add tool,
so the eight attempts of a question share a prompt of several hundred tokens. The trainer
is the demo's too: the bundled SmolLM2-135M, `TrainConfig` defaults with the demo's
learning rate, this machine's dtype (hardware.py). Steps alternate shared / unshared after
one warm-up step of each, so drift hits both; printed: the median step time of each,
tokens/s (the batch's tokens, counted once per sequence as a user's batch holds them) and
the ratio shared / unshared of tokens/s.

  flock /tmp/rlcoach-cpu.lock .venv/bin/python bench/trainer_prefix.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from rlcoach import SampledChoice, Trajectory, TrajectoryGroup
from rlcoach.config import TrainConfig
from rlcoach.demo.task import ADD_TOOL, make_questions
from rlcoach.models.bundled import bundled_model_path
from rlcoach.runtime.hardware import autocast_dtype
from rlcoach.trainer.lora import LoraTrainer
from rlcoach.trainer.step import collect_sequences


def demo_groups(tokenizer, questions: int, group_size: int) -> list[TrajectoryGroup]:
    """`questions` groups of `group_size` two-turn attempts, as the demo's rollouts make
    them (the first reply is exactly what the template renders into the second prompt,
    so an attempt is one training sequence)."""

    def render(messages) -> list[int]:
        return tokenizer.apply_chat_template(
            messages, tools=[ADD_TOOL], add_generation_prompt=True, tokenize=True, return_dict=False
        )

    groups = []
    for q in make_questions(questions, seed=0):
        trajectories = []
        for i in range(group_size):
            call = {
                "id": "call_2",
                "type": "function",
                "function": {"name": "add", "arguments": json.dumps({"a": q.a, "b": q.b + i})},
            }
            asked = q.messages()
            first = render(asked)
            answered = [
                *asked,
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_2", "content": str(q.answer + i)},
            ]
            second = render(answered)
            end = second.index(tokenizer.eos_token_id, len(first))
            reply = second[len(first) : end + 1]
            final = [
                *tokenizer.encode(f"{q.a} + {q.b + i} = {q.answer + i}", add_special_tokens=False),
                tokenizer.eos_token_id,
            ]
            choices = [
                SampledChoice(
                    message={"role": "assistant"},
                    prompt_token_ids=prompt,
                    token_ids=sampled,
                    logprobs=[-0.7] * len(sampled),
                    policy="bench@0",
                )
                for prompt, sampled in ((first, reply), (second, final))
            ]
            trajectories.append(Trajectory(choices=choices, reward=float(i % 2)))
        groups.append(TrajectoryGroup(trajectories=trajectories))
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed steps of each")
    parser.add_argument("--questions", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    path = bundled_model_path()
    groups = demo_groups(AutoTokenizer.from_pretrained(path), args.questions, args.group_size)
    config = TrainConfig(learning_rate=1e-3)  # the demo's TrainableModel config
    sequences, _, _ = collect_sequences(groups, config)
    tokens = sum(len(s.token_ids) for s in sequences)
    prompt = len(groups[0].trajectories[0].choices[0].prompt_token_ids)
    trainer = LoraTrainer(path, config, device="cpu")
    rows = {
        name: trainer.rows(sequences, config.model_copy(update={"share_prefix": share}))
        for name, share in (("unshared", False), ("shared", True))
    }
    print(
        f"batch: {len(groups)} groups x {args.group_size}, {len(sequences)} sequences, "
        f"{tokens} tokens (prompt {prompt}); dtype {autocast_dtype('cpu')}, "
        f"{torch.get_num_threads()} threads"
    )
    for name, packed in rows.items():
        lengths = [int(r.input_ids_T.shape[0]) for r in packed]
        print(f"  {name:8} rows {lengths} = {sum(lengths)} tokens run")
    seconds: dict[str, list[float]] = {"unshared": [], "shared": []}
    for round_ in range(args.rounds + 1):
        for name in seconds:
            step_config = config.model_copy(update={"share_prefix": name == "shared"})
            started = time.perf_counter()
            stats = trainer.step(groups, step_config)
            elapsed = time.perf_counter() - started
            if not stats.trained:
                raise RuntimeError("the step trained nothing")
            if round_:  # round 0 warms both up
                seconds[name].append(elapsed)
            print(f"  round {round_} {name:8} {elapsed:6.2f} s  loss {stats.loss:+.4f}")
    median = {name: statistics.median(values) for name, values in seconds.items()}
    for name, value in median.items():
        rate = tokens / value
        print(f"{name:8} step {value:6.2f} s (median of {args.rounds})  {rate:7.0f} tok/s")
    print(f"ratio shared / unshared (tok/s): {median['unshared'] / median['shared']:.2f}x")


if __name__ == "__main__":
    main()
