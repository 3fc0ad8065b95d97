"""Prefix sharing (trainer/sequences.py): a group's shared prompt runs once per row, and
the step's log-probs and gradients equal those of the unshared packing (on the tiny
random Llama here, in either CPU dtype: `make test` runs this file under both; the
bundled model's check is in test_sequences.py). tests/shared_prompts.py has the groups
and the comparison.
"""

import itertools

import pytest
import torch
import torch.nn.functional as F
from shared_prompts import assert_shared_equals_plain, perturb_adapter, random_groups

from rlcoach.config import TrainConfig
from rlcoach.trainer.sequences import (
    TrainSequence,
    pack_sequences,
    pack_shared,
    share_prefixes,
)
from rlcoach.trainer.step import collect_sequences


def test_prefixes_are_shared_within_a_group_and_every_token_is_kept():
    groups = random_groups(seed=1, vocab=256)
    sequences, _, _ = collect_sequences(groups, TrainConfig())
    units = share_prefixes(sequences, max_tokens=4096)
    assert sorted(id(s) for u in units for s in u.sequences) == sorted(id(s) for s in sequences)
    # each group's whole prompt is shared by its sequences (the split trajectories'
    # second sequences too: they start with the same prompt)
    shared = [u for u in units if u.prefix_tokens]
    assert len(shared) == 3
    for unit in shared:
        assert len({tuple(s.token_ids[: unit.prefix_tokens]) for s in unit.sequences}) == 1
        assert len(unit.sequences) >= 4
    (row,) = pack_shared(units, max_tokens=4096)
    (plain,) = pack_sequences(sequences, max_tokens=4096)
    assert row.sampled_mask_T.sum() == plain.sampled_mask_T.sum()
    assert sorted(row.old_logprobs_T[row.sampled_mask_T.bool()].tolist()) == sorted(
        plain.old_logprobs_T[plain.sampled_mask_T.bool()].tolist()
    )
    saved = sum((len(u.sequences) - 1) * u.prefix_tokens for u in shared)
    assert row.input_ids_T.shape[0] == plain.input_ids_T.shape[0] - saved
    # a suffix's positions continue from its prefix's length
    start, _, context_start, context_end = next(s for s in row.segments if s[3] > s[2])
    assert row.position_ids_T[start] == context_end - context_start


def test_a_group_larger_than_a_row_is_cut_with_the_prefix_in_each_part():
    prompt = list(range(10, 50))
    sequences = [
        TrainSequence([*prompt, *range(100 + i, 120 + i)], [0] * 40 + [1] * 20, [0.0] * 60, 1.0, "")
        for i in range(6)
    ]
    units = share_prefixes(sequences, max_tokens=100)
    assert [len(u.sequences) for u in units] == [3, 3]
    assert all(u.prefix_tokens == 40 and u.tokens == 100 for u in units)
    rows = pack_shared(units, max_tokens=100)
    assert [int(r.input_ids_T.shape[0]) for r in rows] == [100, 100]
    # nothing shorter than MIN_SHARED_TOKENS is shared
    short = [TrainSequence([1, 2, 3, 4, i], [0, 0, 0, 1, 1], [0.0] * 5, 1.0, "") for i in range(3)]
    assert all(u.prefix_tokens == 0 for u in share_prefixes(short, max_tokens=100))


def test_groups_that_fit_no_row_whole_fill_the_rows_left_with_the_prefix_again():
    """Six groups of 8 x (10 + 30) tokens in rows of 400: whole, one group a row (250 of
    400); split, the rows are filled to the last 10% but for the last one, no sequence is
    lost or repeated, and a unit whose suffixes are shorter than its prefix is not split."""
    groups = [
        [
            TrainSequence(
                [*range(g * 100, g * 100 + 10), *range(1000 + i * 30, 1030 + i * 30)],
                [0] * 10 + [1] * 30,
                [0.0] * 40,
                1.0,
                "",
            )
            for i in range(8)
        ]
        for g in range(6)
    ]
    sequences = [s for group in groups for s in group]
    units = share_prefixes(sequences, max_tokens=400)
    assert sorted(u.tokens for u in units) == [250] * 6
    rows = pack_shared(units, max_tokens=400)
    lengths = [int(r.input_ids_T.shape[0]) for r in rows]
    assert len(rows) == 4 and max(lengths) <= 400 and min(lengths[:-1]) >= 360, lengths
    assert sum(len(r.sequence_lengths) for r in rows) == len(sequences)
    assert sum(int(r.sampled_mask_T.sum()) for r in rows) == 30 * len(sequences)
    # 100 prompt + 2 reply tokens four times, beside a row with 105 free: two would fit
    # with the prompt again, which would compute 100 tokens more to save 4
    long_prompt = [
        TrainSequence([*range(100), 500 + i, 600 + i], [0] * 100 + [1] * 2, [0.0] * 102, 1.0, "")
        for i in range(4)
    ]
    rows = pack_shared(share_prefixes(long_prompt + groups[1], 355), 355)
    assert sorted(int(r.input_ids_T.shape[0]) for r in rows) == [108, 250]


def test_sequences_longer_than_a_row_still_share_their_prompt_in_rows_of_twice_the_longest():
    """An agent's prompt (its tools' schemas) can be longer than `micro_batch_tokens`: each
    sequence is then a row over the limit on its own, and held to the limit none would
    share. They share it in units of up to twice the longest sequence instead."""
    prompt = list(range(1000, 1150))
    sequences = [
        TrainSequence(
            [*prompt, *range(i * 40, i * 40 + 30)], [0] * 150 + [1] * 30, [0.0] * 180, 1.0, ""
        )
        for i in range(7)
    ]
    units = share_prefixes(sequences, max_tokens=100)
    assert [(u.prefix_tokens, len(u.sequences), u.tokens) for u in units] == [(150, 7, 360)]
    (row,) = pack_shared(units, max_tokens=100)
    assert row.input_ids_T.shape[0] == 360  # not 7 rows of 180
    # an eighth would pass twice the longest: it starts a unit of its own
    units = share_prefixes([*sequences, sequences[0]], max_tokens=100)
    assert sorted(len(u.sequences) for u in units) == [1, 7]


def test_shared_log_probs_and_gradients_equal_the_plain_ones_on_a_tiny_model(tiny_model):
    """Tiny random Llama (GQA), KL term on (the reference pass shares too), rows small
    enough that a group is cut over several rows."""
    from rlcoach.trainer.lora import LoraTrainer

    config = TrainConfig(micro_batch_tokens=160, kl_coef=0.05, logprob_chunk_tokens=64)
    trainer = LoraTrainer(tiny_model, config, device="cpu")
    perturb_adapter(trainer, seed=0)
    plain_tokens, shared_tokens = assert_shared_equals_plain(
        trainer, random_groups(seed=2, vocab=256), config
    )
    assert shared_tokens < 0.75 * plain_tokens


def test_dense_mask_and_flash_bias_paths_agree_with_segment_attention(tiny_model, monkeypatch):
    """The two other ways a shared row is attended (a dense [T x T] mask for models not
    loaded with the segment attention; the lower-right causal bias a GPU uses) give the
    segment attention's log-probs. The GPU's branch is forced on the CPU (the one seam
    faked: no GPU here); torch runs its bias there with a materialised mask."""
    from transformers import AutoModelForCausalLM

    from rlcoach.trainer import attention
    from rlcoach.trainer.attention import SEGMENT_ATTENTION, register_segment_attention
    from rlcoach.trainer.lora import chunked_token_logprobs

    register_segment_attention()
    sequences, _, _ = collect_sequences(random_groups(seed=3, vocab=256), TrainConfig())
    (row,) = pack_shared(share_prefixes(sequences, 4096), 4096)
    ids, positions = row.input_ids_T[None], row.position_ids_T[None]
    dense = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    fast = AutoModelForCausalLM.from_pretrained(
        tiny_model, dtype=torch.float32, attn_implementation=SEGMENT_ATTENTION
    )
    with torch.no_grad():
        want = chunked_token_logprobs(fast, ids, positions, 64, segments=row.segments)
        got = chunked_token_logprobs(dense, ids, positions, 64, segments=row.segments)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        original = attention._lower_right_causal
        monkeypatch.setattr(
            attention, "_lower_right_causal", lambda *args: original(*args[:-1], True)
        )
        flash = chunked_token_logprobs(fast, ids, positions, 64, segments=row.segments)
    torch.testing.assert_close(flash, want, atol=1e-5, rtol=0)


def _reference_varlen(q_THD, k_TKD, v_TKD, cu_q, cu_k, max_q, max_k, *, scale, **options):
    """FlashAttention's varlen contract, on the CPU: the queries of piece i (rows cu_q[i]..
    cu_q[i+1]) attend its keys (cu_k[i]..cu_k[i+1]) causally, aligned bottom-right."""
    assert options.get("window_size") == (-1, 0)
    cu_q, cu_k, out = cu_q.tolist(), cu_k.tolist(), []
    for (q0, q1), (k0, k1) in zip(itertools.pairwise(cu_q), itertools.pairwise(cu_k), strict=True):
        assert q1 - q0 <= max_q and k1 - k0 <= max_k
        allowed = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool).tril(k1 - k0 - (q1 - q0))
        heads = lambda t: t.transpose(0, 1)[None]  # noqa: E731
        out.append(
            F.scaled_dot_product_attention(
                heads(q_THD[q0:q1]),
                heads(k_TKD[k0:k1]),
                heads(v_TKD[k0:k1]),
                attn_mask=allowed,
                scale=scale,
                enable_gqa=options.get("enable_gqa", False),
            )[0].transpose(0, 1)
        )
    return torch.cat(out)


@pytest.mark.parametrize("shared", [True, False], ids=["shared-prefix", "plain"])
@pytest.mark.parametrize("takes_groups", [True, False], ids=["gqa-kernel", "heads-repeated"])
def test_one_varlen_call_attends_a_row_as_the_loop_over_pieces_does(
    monkeypatch, shared, takes_groups
):
    """The varlen path's plan (cumulative lengths, each piece's keys gathered from its
    prefix and itself, grouped heads) gives the loop's output and q/k/v gradients on a
    real packed row, the prefix's key gradients summed over its suffixes. The kernel is
    CUDA-only, so it is the one seam faked: a CPU reference of its contract stands in."""
    from rlcoach.trainer import attention

    sequences, _, _ = collect_sequences(random_groups(seed=4, vocab=256), TrainConfig())
    if shared:
        (row,) = pack_shared(share_prefixes(sequences, 4096), 4096)
    else:
        (row,) = pack_sequences(sequences, 4096)
    segments = row.segments or tuple(
        (a, b, a, a) for a, b in itertools.pairwise(attention.segment_bounds(row.position_ids_T))
    )
    assert any(c != d for _, _, c, d in segments) == shared
    length, generator = int(row.input_ids_T.shape[0]), torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, length, heads, 16, generator=generator).transpose(1, 2)
        for heads in (4, 2, 2)
    )
    grad = torch.randn(1, length, 4, 16, generator=generator)
    module = torch.nn.Module().eval()

    def attend():
        inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        table = torch.tensor(segments)
        out, _ = attention.segment_attention(module, *inputs, None, rlcoach_segments=table)
        out.backward(grad)
        return out.detach(), [t.grad for t in inputs]

    want, want_grads = attend()
    calls = []

    def kernel(*args, **options):
        calls.append(options)
        return _reference_varlen(*args, **options)

    monkeypatch.setattr(
        attention, "_varlen_kernel", lambda: (kernel, {"window_size": (-1, 0)}, takes_groups)
    )
    monkeypatch.setattr(attention, "_varlen_serves", lambda query: True)
    got, got_grads = attend()
    assert len(calls) == 1 and calls[0].get("enable_gqa", False) == takes_groups
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    for got_grad, want_grad in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(got_grad, want_grad, atol=1e-5, rtol=0)


def test_varlen_plan_gathers_each_suffixs_prefix_then_itself():
    from rlcoach.trainer.attention import varlen_plan

    plan = varlen_plan([(0, 4, 0, 0), (4, 6, 0, 4), (6, 9, 0, 4), (9, 11, 9, 9)])
    assert plan is not None
    assert plan.cu_queries == [0, 4, 6, 9, 11]
    assert plan.cu_keys == [0, 4, 10, 17, 19]
    assert plan.key_positions == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 6, 7, 8, 9, 10]
    assert (plan.max_queries, plan.max_keys) == (4, 7)
    plain = varlen_plan([(0, 3, 0, 0), (3, 8, 3, 3)])
    assert plain is not None and plain.key_positions is None and plain.cu_keys == [0, 3, 8]
    assert varlen_plan([(2, 4, 2, 2)]) is None  # not from the row's start: the loop's case


def test_pieces_out_of_row_order_are_attended_by_the_loop_even_where_varlen_serves(monkeypatch):
    from rlcoach.trainer import attention

    monkeypatch.setattr(attention, "_varlen_serves", lambda query: True)
    monkeypatch.setattr(attention, "_varlen_kernel", lambda: pytest.fail("varlen was called"))
    q, k, v = (torch.randn(1, heads, 10, 8) for heads in (2, 1, 1))
    pieces = torch.tensor([(6, 10, 0, 0), (0, 6, 0, 0)])  # a suffix table, not in order
    out, _ = attention.segment_attention(
        torch.nn.Module().eval(), q, k, v, None, rlcoach_segments=pieces
    )
    assert out.shape == (1, 10, 2, 8)
