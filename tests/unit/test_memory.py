"""The GPU memory estimate that refuses a placement at registration (memory.py).

Pure arithmetic on model configs; the GPU peaks it is checked against are the ones
measured on an H200 in docs/benchmarks-gpu.md (Qwen3 shapes, LoRA rank 16)."""

import pytest

from rlcoach import ConfigError
from rlcoach.runtime.memory import GiB, MemoryPlan, ModelShape, check_memory, plan_memory

QWEN3_4B = {
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
QWEN3_8B = {
    **QWEN3_4B,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "tie_word_embeddings": False,
}
SETTINGS = {
    "max_model_len": 4096,
    "max_loras": 2,
    "max_lora_rank": 16,
    "lora_rank": 16,
    "logprob_chunk_tokens": 2048,
}


def _peak(config: dict, tokens: int, checkpointing: bool) -> float:
    plan = plan_memory(
        ModelShape.from_config(config),
        gpu_bytes=139 * GiB,
        colocation="dedicated",
        gpu_memory_utilization=0.9,
        micro_batch_tokens=tokens,
        activation_checkpointing=checkpointing,
        **SETTINGS,
    )
    return plan.trainer_peak_bytes / GiB


def _compiled(tokens: int, **placement) -> MemoryPlan:
    """The GPU default (compiled layers, fused LoRA), at the default 1024-token chunk."""
    where = {"gpu_bytes": 139 * GiB, "colocation": "dedicated", "gpu_memory_utilization": 0.9}
    return plan_memory(
        ModelShape.from_config(QWEN3_4B),
        micro_batch_tokens=tokens,
        activation_checkpointing=False,
        compiled_layers=True,
        **{**where, **placement},
        **{**SETTINGS, "logprob_chunk_tokens": 1024},
    )


@pytest.mark.parametrize(
    ("tokens", "measured_gib"),
    [
        # in the RL loop (bench/gpu/step.py on an H100, rows filled to ~98%): the peak
        # allocated plus the 1.14 GiB the process held outside PyTorch's allocator
        (7616, 40.43 + 1.14),  # 14 sequences of ~515 tokens a pass, split mode
        (8704, 45.97 + 1.14),  # 16 of them, colocated (vLLM asleep)
        (8192, 42.4),  # 2 x 4K (H100, docs/benchmarks-gpu.md)
        (16384, 75.0),  # 4 x 4K (H200)
    ],
)
def test_the_compiled_trainer_estimate_is_within_15_percent_of_measured_peaks(tokens, measured_gib):
    estimate = _compiled(tokens).trainer_peak_bytes / GiB
    assert measured_gib <= estimate <= 1.15 * measured_gib


@pytest.mark.parametrize(
    ("tokens", "measured_gib"), [(4120, 24.5), (8240, 38.9)]
)  # the trainer alone (bench/gpu/trainer.py), 8 and 16 sequences of ~515 tokens
def test_the_compiled_estimate_covers_the_trainer_alone(tokens, measured_gib):
    estimate = _compiled(tokens).trainer_peak_bytes / GiB
    assert measured_gib <= estimate <= 1.2 * measured_gib


def test_fourteen_loop_sequences_fit_beside_vllm_on_an_h100_and_sixteen_do_not():
    """The whole-step benchmark (bench/gpu/step.py) beside vLLM at 0.4 of an 80 GB H100,
    rows filled to ~98%: 14 sequences of 544 tokens a pass ran (76.9 GiB in use at most);
    16 ran out of memory in the first step, vLLM's process holding 34.35 GiB (2.65 beyond
    its share) and the trainer's 44.73 GiB. The plan refuses the second."""
    h100 = {"gpu_bytes": int(79.18 * GiB), "colocation": "split", "gpu_memory_utilization": 0.4}
    fits = _compiled(14 * 544, **h100)
    assert fits.fits, fits.problems
    refused = _compiled(16 * 544, **h100)
    assert not refused.fits and "beside vLLM" in refused.problems[0]


def test_the_parameter_count_matches_the_published_shapes():
    assert ModelShape.from_config(QWEN3_4B).params == pytest.approx(4.02e9, rel=0.01)
    assert ModelShape.from_config(QWEN3_8B).params == pytest.approx(8.19e9, rel=0.01)


@pytest.mark.parametrize(
    ("config", "tokens", "checkpointing", "measured_gib"),
    [
        (QWEN3_4B, 4096, False, 31.1),  # rows of 4K, eager
        (QWEN3_8B, 4096, False, 47.7),
        (QWEN3_4B, 16384, True, 14.7),  # one 16K row, activation checkpointing
        (QWEN3_8B, 16384, True, 23.7),
    ],
)
def test_the_trainer_estimate_covers_measured_peaks(config, tokens, checkpointing, measured_gib):
    estimate = _peak(config, tokens, checkpointing)
    assert measured_gib <= estimate <= 1.2 * measured_gib + 1.0


def test_a_gpu_too_small_for_the_mode_is_refused_with_what_fits():
    shape = ModelShape.from_config(QWEN3_4B)
    with pytest.raises(ConfigError) as refused:
        check_memory(
            shape,
            gpu_bytes=139 * GiB,
            colocation="split",
            gpu_memory_utilization=0.85,
            micro_batch_tokens=16384,
            activation_checkpointing=False,
            **SETTINGS,
        )
    message = str(refused.value)
    assert "the trainer needs" in message and "GiB" in message and "Fix:" in message
    assert "colocation='sleep'" in message  # sleeping vLLM leaves the trainer the GPU
    plan = check_memory(
        shape,
        gpu_bytes=139 * GiB,
        colocation="sleep",
        gpu_memory_utilization=0.85,
        micro_batch_tokens=16384,
        activation_checkpointing=False,
        **SETTINGS,
    )
    assert plan.fits and plan.kv_cache_tokens > 500_000


def test_each_suggested_fix_fits():
    shape = ModelShape.from_config(QWEN3_4B)
    base = {
        "gpu_bytes": 80 * GiB,
        "colocation": "split",
        "gpu_memory_utilization": 0.85,
        "micro_batch_tokens": 16384,
        "activation_checkpointing": False,
        **SETTINGS,
    }
    with pytest.raises(ConfigError) as refused:
        check_memory(shape, **base)
    fixes = str(refused.value).split("Fix: ")[1].split(" or ")
    assert fixes
    for fix in fixes:
        change = {}
        for part in fix.split(" with "):
            key, _, value = part.removeprefix("TrainConfig(").rstrip(")").partition("=")
            change[key] = {"True": True}.get(value, value.strip("'"))
            if key in ("gpu_memory_utilization",):
                change[key] = float(value)
            if key == "micro_batch_tokens":
                change[key] = int(value)
        assert plan_memory(shape, **{**base, **change}).fits, fix


def test_a_config_without_the_sizes_is_a_clear_error():
    with pytest.raises(ConfigError, match="hidden_size"):
        ModelShape.from_config({"model_type": "mystery"})


def test_rows_longer_than_the_micro_batch_are_planned_for():
    """A sequence up to `max_model_len` is a row of its own, and long sequences sharing a
    prompt share it in rows of up to twice that (trainer/sequences.py): the plan sizes the
    peak by the packer's own `row_token_limit`, not by `micro_batch_tokens` alone, and
    the fixes it offers then shorten the rows."""
    from rlcoach.config import row_token_limit
    from rlcoach.trainer.sequences import TrainSequence, pack_shared, share_prefixes

    prompt = list(range(3000))
    long = [
        TrainSequence(
            [*prompt, *range(5000 + i * 1000, 6000 + i * 1000)],
            [0] * 3000 + [1] * 1000,
            [0.0] * 4000,
            1.0,
            "",
        )
        for i in range(3)
    ]
    rows = pack_shared(share_prefixes(long, 1024), 1024)
    assert max(int(r.input_ids_T.shape[0]) for r in rows) <= row_token_limit(1024, 4000)
    assert row_token_limit(1024, 4096) == 8192 and row_token_limit(1024, 4096, False) == 4096
    assert row_token_limit(8192, 4096) == 8192

    shape = ModelShape.from_config(QWEN3_4B)
    settings = {**SETTINGS, "logprob_chunk_tokens": 1024, "compiled_layers": True}
    common = {"gpu_bytes": 139 * GiB, "colocation": "dedicated", "gpu_memory_utilization": 0.9}
    short_rows = plan_memory(
        shape, micro_batch_tokens=8192, activation_checkpointing=False, **common, **settings
    )
    default = plan_memory(
        shape, micro_batch_tokens=1024, activation_checkpointing=False, **common, **settings
    )
    assert default.trainer_peak_bytes == short_rows.trainer_peak_bytes  # 2 x 4096 either way
    base = {
        "gpu_bytes": 80 * GiB,
        "colocation": "split",
        "gpu_memory_utilization": 0.6,
        "micro_batch_tokens": 1024,
        "activation_checkpointing": False,
        **settings,
    }
    with pytest.raises(ConfigError, match="rows of up to 8192 tokens") as refused:
        check_memory(shape, **base)
    fixes = str(refused.value).split("Fix: ")[1]
    assert "micro_batch_tokens=" not in fixes  # halving it would not shorten a row
    assert plan_memory(shape, **{**base, "share_prefix": False}).trainer_peak_bytes < (
        plan_memory(shape, **base).trainer_peak_bytes
    )
