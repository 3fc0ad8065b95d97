"""Trainer step throughput on a GPU: our LoRA GRPO step against TRL's, same inputs.

Both sides train a LoRA (rank 16, alpha 32, all linear layers) on a random-weight model
of a real shape, on the same batch: B sequences of P prompt + C completion random token
ids, random advantages; with `--shared-prompt` the B prompts are one prompt, as in a GRPO
group (both sides get it; ours then runs it once per row unless `--no-share-prefix`,
`TrainConfig.share_prefix`; TRL runs the whole [B, P+C] batch). One side is
`LoraTrainer.step` (the real API: trajectory groups in, one AdamW step out); the other is
TRL's `GRPOTrainer` loss step as a user gets it (its `_compute_loss` under bf16 autocast,
backward, its optimizer), generation excluded.
Each measurement runs in its own process, so peak memory is that run's alone.

  # one measurement (prints a RESULT json line)
  python bench/gpu/trainer.py one --who ours --model /tmp/m4b --batch 4 --prompt 512 \
      --completion 3584 --steps 3 [--ckpt] [--chunk 2048] [--row 16384]
  # a grid, each config for both sides, then a table of ratios (ours / TRL)
  python bench/gpu/trainer.py grid --model /tmp/m4b --configs 4x512+3584 1x1024+15360:ckpt
  (flags after ':' apply to our side: ckpt, nockpt, row<tokens>, chunk<tokens>,
   profile, nocompile, nofuse, nofusedlogprob, noshare, novarlen; notrl skips the peer; with
   --trl-same-flags TRL gets ckpt/nockpt too; `grid --shared-prompt` gives both sides
   one prompt per group)
  # no GPU: a tiny check of the plumbing on the CPU (any small model folder)
  python bench/gpu/trainer.py one --who ours --model <folder> --batch 8 --prompt 64 \
      --completion 16 --steps 1 --shared-prompt --no-compile --no-fuse

Reported: tokens/s (prompt + completion tokens per second of wall time, synchronised),
peak allocated GPU memory, and MFU by the usual 6·N·tokens/s convention against the
H100/H200 dense bf16 peak of 989 TFLOP/s (N = all base-model parameters), the convention
the published anchors use. A LoRA step skips the base weights' gradients, so its real
arithmetic is nearer 4·N (5.3·N with checkpointing); 6·N keeps the numbers comparable.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

PEAK_FLOPS = 989e12
PROFILE = False
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _inputs(
    batch: int, prompt: int, completion: int, shared: bool = False
) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    prompts = 1 if shared else batch
    return {
        "prompt_ids": torch.randint(100, 30000, (prompts, prompt), generator=generator).expand(
            batch, prompt
        ),
        "completion_ids": torch.randint(100, 30000, (batch, completion), generator=generator),
        "advantages": torch.randn(batch, generator=generator),
    }


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


WARMUP: dict[str, float] = {}


def _timed(step, steps: int) -> float:
    started = time.perf_counter()
    step()  # warm-up: allocator, kernels, autotuning, torch.compile
    _sync()
    WARMUP["warmup_s"] = time.perf_counter() - started
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    _sync()
    seconds = (time.perf_counter() - started) / steps
    if PROFILE:
        _profile(step)
    return seconds


def _profile(step) -> None:
    """One more step under torch.profiler: GPU busy time against wall time (a GPU far
    from busy means the step waits on the CPU launching kernels), and the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        step()
        _sync()
        wall = time.perf_counter() - started
    events = prof.key_averages()
    busy = sum(e.self_device_time_total for e in events) / 1e6
    launches = sum(
        e.count
        for e in events
        if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")
    )
    print(
        f"PROFILE wall {wall:.3f} s, GPU kernels busy {busy:.3f} s "
        f"({100 * busy / wall:.0f}%), kernel launches {launches}"
    )
    table = events.table(sort_by="self_device_time_total", row_limit=14, max_name_column_width=48)
    print("\n".join(line[:150] for line in table.splitlines()), flush=True)


def run_ours(args: argparse.Namespace) -> dict[str, object]:
    from rlcoach.config import TrainConfig
    from rlcoach.trainer import attention
    from rlcoach.trainer.lora import LoraTrainer
    from rlcoach.trajectory.trajectories import SampledChoice, Trajectory, TrajectoryGroup

    attention.USE_VARLEN = args.varlen
    data = _inputs(args.batch, args.prompt, args.completion, args.shared_prompt)
    vocab = json.loads(Path(args.model, "config.json").read_text())["vocab_size"]
    old = -float(torch.log(torch.tensor(float(vocab))))  # about a random model's logprob
    trajectories = []
    for b in range(args.batch):
        choice = SampledChoice(
            message={"role": "assistant", "content": ""},
            policy="bench@0",
            prompt_token_ids=data["prompt_ids"][b].tolist(),
            token_ids=data["completion_ids"][b].tolist(),
            logprobs=[old] * args.completion,
        )
        trajectories.append(Trajectory(choices=[choice], reward=float(data["advantages"][b])))
    groups = [TrajectoryGroup(trajectories=trajectories)]
    tokens = args.batch * (args.prompt + args.completion)
    config = TrainConfig(
        learning_rate=1e-5,
        micro_batch_tokens=args.row or tokens,
        logprob_chunk_tokens=args.chunk,
        activation_checkpointing=args.ckpt,
        compile_layers=args.compile,
        fused_lora=args.fuse,
        fused_logprob=args.fused_logprob,
        share_prefix=args.share_prefix,
        lora={"rank": 16, "alpha": 32},
    )
    trainer = LoraTrainer(args.model, config)
    if args.peftcast:  # peft's default input cast, to measure what skipping it saves
        for module in trainer.model.modules():
            if hasattr(module, "lora_A"):
                module.cast_input_dtype_enabled = True
    params = sum(
        p.numel() for p in trainer.model.get_base_model().parameters() if not p.requires_grad
    )
    lora_dtype = next(p.dtype for p in trainer.model.parameters() if p.requires_grad)

    def step() -> None:
        stats = trainer.step(groups)
        if not stats.trained:
            raise RuntimeError("the step trained nothing: the batch needs >= 2 sequences")
        # The first step's loss and gradient norm: equal across our configurations (same
        # seed, same batch) up to bf16 rounding, a check that fusing changed no numbers.
        WARMUP.setdefault("first_loss", stats.loss)
        WARMUP.setdefault("first_grad_norm", stats.grad_norm)

    seconds = _timed(step, args.steps)
    return {
        "who": "ours",
        "params": params,
        "tokens": tokens,
        "step_s": seconds,
        "lora_dtype": str(lora_dtype),
        "ckpt": args.ckpt,
        "compile": args.compile,
        "fuse": args.fuse,
        "fused_logprob": args.fused_logprob,
        "shared_prompt": args.shared_prompt,
        "share_prefix": args.share_prefix,
        "varlen": args.varlen,
        **WARMUP,
    }


def run_trl(args: argparse.Namespace) -> dict[str, object]:
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = (args.batch, args.prompt, args.completion, args.shared_prompt)
    data = {k: v.to(device) for k, v in _inputs(*shape).items()}
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.bfloat16, attn_implementation="sdpa"
    )
    extra = {} if args.ckpt is None else {"gradient_checkpointing": args.ckpt}
    config = GRPOConfig(
        output_dir="/tmp/trl_bench",
        per_device_train_batch_size=args.batch,
        num_generations=args.batch,
        beta=0.0,
        bf16=device == "cuda",
        use_cpu=device == "cpu",
        report_to="none",
        save_strategy="no",
        max_completion_length=args.completion,
        learning_rate=1e-5,
        logging_steps=1000,
        **extra,
    )
    trainer = GRPOTrainer(
        model=model,
        args=config,
        processing_class=tokenizer,
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        train_dataset=Dataset.from_dict({"prompt": ["hi"] * args.batch}),
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS),
    )
    wrapped = trainer.model.to(device)
    wrapped.train()
    optimizer = trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1
    ones = torch.ones
    inputs = {
        "prompt_ids": data["prompt_ids"],
        "completion_ids": data["completion_ids"],
        "prompt_mask": ones(args.batch, args.prompt, dtype=torch.long, device=device),
        "completion_mask": ones(args.batch, args.completion, dtype=torch.long, device=device),
        "advantages": data["advantages"],
        "num_items_in_batch": torch.tensor(float(args.batch * args.completion), device=device),
    }

    def step() -> None:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = trainer._compute_loss(wrapped, inputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    params = sum(p.numel() for p in wrapped.parameters() if not p.requires_grad)
    seconds = _timed(step, args.steps)
    return {
        "who": "trl",
        "trl": trl.__version__,
        "params": params,
        "tokens": args.batch * (args.prompt + args.completion),
        "step_s": seconds,
        "ckpt": bool(trainer.args.gradient_checkpointing),
        "shared_prompt": args.shared_prompt,
    }


def one(args: argparse.Namespace) -> None:
    global PROFILE
    PROFILE = args.profile
    try:
        result = run_ours(args) if args.who == "ours" else run_trl(args)
    except torch.OutOfMemoryError as e:
        result = {"who": args.who, "oom": True, "error": str(e).splitlines()[0][:160]}
    else:
        result["tok_s"] = result["tokens"] / result["step_s"]
        result["mfu_6N"] = 6 * result["params"] * result["tok_s"] / PEAK_FLOPS
        if torch.cuda.is_available():
            result["peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
    result.update(batch=args.batch, prompt=args.prompt, completion=args.completion)
    print("RESULT", json.dumps(result), flush=True)


def _parse(config: str) -> tuple[int, int, int, list[str]]:
    """`4x512+3584:ckpt` → batch 4, prompt 512, completion 3584, flags [ckpt]."""
    shape, *flags = config.split(":")
    batch, lengths = shape.split("x")
    prompt, completion = lengths.split("+")
    return int(batch), int(prompt), int(completion), flags


def _spawn(
    model: str, who: str, config: str, steps: int, chunk: int, shared_prompt: bool
) -> dict[str, object]:
    batch, prompt, completion, flags = _parse(config)
    command = [
        sys.executable,
        __file__,
        "one",
        "--who",
        who,
        "--model",
        model,
        "--batch",
        str(batch),
        "--prompt",
        str(prompt),
        "--completion",
        str(completion),
        "--steps",
        str(steps),
        "--chunk",
        str(chunk),
    ]
    if shared_prompt:
        command.append("--shared-prompt")
    for flag in flags:
        if flag == "ckpt":
            command.append("--ckpt")
        elif flag == "nockpt":
            command.append("--no-ckpt")
        elif flag in ("profile", "peftcast"):
            command.append(f"--{flag}")
        elif flag in ("nocompile", "nofuse"):
            command.append(f"--no-{flag[2:]}")
        elif flag == "nofusedlogprob":
            command.append("--no-fused-logprob")
        elif flag == "noshare":
            command.append("--no-share-prefix")
        elif flag == "novarlen":
            command.append("--no-varlen")
        elif flag.startswith("chunk"):
            command[command.index("--chunk") + 1] = flag[5:]
        elif flag.startswith("row"):
            command += ["--row", flag[3:]]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        tail = (done.stdout + done.stderr).strip().splitlines()[-12:]
        print(
            f"[{who} {config}] failed (exit {done.returncode}):\n  " + "\n  ".join(tail), flush=True
        )
        return {"who": who, "failed": True}
    if "profile" in flags:
        print(
            "\n".join(line for line in done.stdout.splitlines() if not line.startswith("RESULT ")),
            flush=True,
        )
    result = json.loads(lines[-1][len("RESULT ") :])
    result["wall_s"] = time.perf_counter() - started
    print(f"[{who} {config}] {json.dumps(result)}", flush=True)
    return result


def _cell(result: dict[str, object]) -> str:
    if result.get("failed"):
        return "failed".rjust(28)
    if result.get("oom"):
        return "out of memory".rjust(28)
    peak = result.get("peak_gb")
    peak_text = f"{peak:5.1f} GB" if peak is not None else "    - GB"
    return f"{result['tok_s']:8.0f} tok/s {peak_text} {100 * result['mfu_6N']:4.1f}%"


def grid(args: argparse.Namespace) -> None:
    rows = []
    for config in args.configs:
        ours = _spawn(args.model, "ours", config, args.steps, args.chunk, args.shared_prompt)
        trl_config = config if args.trl_same_flags else config.split(":")[0]
        want_trl = args.trl and "notrl" not in config.split(":")
        peer = (
            _spawn(args.model, "trl", trl_config, args.steps, args.chunk, args.shared_prompt)
            if want_trl
            else {}
        )
        rows.append((config, ours, peer))
    print(
        f"\ntrainer step, {args.model}, LoRA r=16 all linear, {args.steps} timed steps after "
        "one warm-up; cells: tokens/s, peak GPU memory, 6N MFU vs 989 TFLOP/s"
    )
    print(f"{'config (B x prompt+completion)':32} {'ours':>28} {'TRL GRPOTrainer':>28}  ratio")
    for config, ours, peer in rows:
        ratio = "-"
        if "tok_s" in ours and "tok_s" in peer:
            ratio = f"{ours['tok_s'] / peer['tok_s']:.2f}x"
        print(f"{config:32} {_cell(ours)} {_cell(peer) if peer else '-'.rjust(28)}  {ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("one")
    p.add_argument("--who", choices=["ours", "trl"], required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--completion", type=int, default=3584)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--chunk", type=int, default=2048, help="our log-prob chunk (tokens)")
    p.add_argument("--row", type=int, default=0, help="our packed row size (0: whole batch)")
    p.add_argument("--profile", action="store_true", help="profile one more step")
    p.add_argument("--peftcast", action="store_true", help="keep peft's fp32 input cast")
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="our TrainConfig.compile_layers",
    )
    p.add_argument(
        "--fuse",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="our TrainConfig.fused_lora",
    )
    p.add_argument(
        "--fused-logprob",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="our TrainConfig.fused_logprob",
    )
    p.add_argument(
        "--shared-prompt", action="store_true", help="one prompt for the batch (a GRPO group)"
    )
    p.add_argument(
        "--share-prefix",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="our TrainConfig.share_prefix",
    )
    p.add_argument(
        "--varlen",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="attend a row in one varlen call (trainer/attention.py; off: a loop over pieces)",
    )
    p.add_argument(
        "--ckpt",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="activation checkpointing (TRL: its default when not given)",
    )
    g = sub.add_parser("grid")
    g.add_argument("--model", required=True)
    g.add_argument("--configs", nargs="+", required=True)
    g.add_argument("--steps", type=int, default=3)
    g.add_argument("--chunk", type=int, default=2048)
    g.add_argument("--no-trl", dest="trl", action="store_false")
    g.add_argument("--shared-prompt", action="store_true", help="one prompt per batch, both sides")
    g.add_argument(
        "--trl-same-flags",
        action="store_true",
        help="give TRL the same :ckpt/:nockpt flag (default: TRL's own default)",
    )
    args = parser.parse_args()
    if args.command == "one":
        if args.who == "ours" and args.ckpt is None:
            args.ckpt = False
        one(args)
    else:
        grid(args)


if __name__ == "__main__":
    main()
