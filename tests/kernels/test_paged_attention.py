"""Paged attention (fast path and reference) against dense causal attention computed
independently on the unpaged, contiguous K/V of each sequence."""

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from kernels.attention_plan import CPU_ATTENTION, ONE_CALL_ATTENTION, AttentionPolicy
from kernels.attention_inputs import slot_ids_of
from kernels.paged_attention import AttentionInputs, paged_attention, paged_attention_reference, store_kv

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}

# (context_len, query_len) per sequence; prefix = context_len - query_len is already cached
BATCHES = {
    "decode": [(1, 1), (5, 1), (16, 1), (17, 1), (33, 1), (100, 1), (64, 1)],
    "mixed": [(20, 20), (45, 1), (50, 13), (7, 1), (32, 16), (9, 2), (1, 1)],
    "cold_prefill": [(70, 70), (3, 3)],
    "long_prefix_chunk": [(400, 300), (130, 1)],
}


@dataclass
class Case:
    q: torch.Tensor  # (N, H, D)
    k_cache: torch.Tensor  # (num_pages, page_size, KVH, D)
    v_cache: torch.Tensor
    inputs: AttentionInputs
    expected: torch.Tensor  # (N, H, D) float64, dense attention on the unpaged K/V
    scale: float


def make_case(seqs, page_size, num_kv_heads, group, dtype, device, head_dim=32, seed=0) -> Case:
    gen = torch.Generator().manual_seed(seed)
    num_heads = num_kv_heads * group
    pages_per_seq = [math.ceil(context_len / page_size) for context_len, _ in seqs]
    num_pages = sum(pages_per_seq) + 3
    # NaN everywhere nothing was written: reading an unwritten slot poisons the output
    k_cache = torch.full((num_pages, page_size, num_kv_heads, head_dim), float("nan"), dtype=dtype, device=device)
    v_cache = torch.full_like(k_cache, float("nan"))
    shuffled = torch.randperm(num_pages, generator=gen).tolist()
    page_ids_per_seq, new_slots, qs, new_ks, new_vs, expected = [], [], [], [], [], []
    scale = head_dim**-0.5
    for context_len, query_len in seqs:
        pages, shuffled = shuffled[: math.ceil(context_len / page_size)], shuffled[math.ceil(context_len / page_size) :]
        page_ids_per_seq.append(pages)
        slots = slot_ids_of(pages, 0, context_len, page_size)
        k = torch.randn(context_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(context_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        q = torch.randn(query_len, num_heads, head_dim, generator=gen).to(dtype)
        prefix_len = context_len - query_len
        if prefix_len:  # written by earlier steps
            prefix_slots = torch.tensor(slots[:prefix_len], device=device)
            store_kv(k_cache, v_cache, k[:prefix_len].to(device), v[:prefix_len].to(device), prefix_slots)
        new_slots += slots[prefix_len:]
        qs.append(q)
        new_ks.append(k[prefix_len:])
        new_vs.append(v[prefix_len:])
        expected.append(_dense_attention(q, k, v, scale))
    inputs = AttentionInputs.build(
        new_slots, [query_len for _, query_len in seqs], [c for c, _ in seqs], page_ids_per_seq, device
    )
    store_kv(k_cache, v_cache, torch.cat(new_ks).to(device), torch.cat(new_vs).to(device), inputs.slot_ids)
    return Case(torch.cat(qs).to(device), k_cache, v_cache, inputs, torch.cat(expected), scale)


def _dense_attention(q, k, v, scale):
    """q (T, H, D), k/v (C, KVH, D) contiguous -> (T, H, D) float64, bottom-right causal."""
    query_len, num_heads, _ = q.shape
    context_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    q64 = q.double().transpose(0, 1)[None]  # (1, H, T, D)
    k64 = k.double().repeat_interleave(group, dim=1).transpose(0, 1)[None]  # (1, H, C, D)
    v64 = v.double().repeat_interleave(group, dim=1).transpose(0, 1)[None]
    visible = torch.ones(query_len, context_len, dtype=torch.bool).tril(context_len - query_len)
    out = F.scaled_dot_product_attention(q64, k64, v64, attn_mask=visible, scale=scale)
    return out[0].transpose(0, 1)


def _check(got, case, dtype):
    assert got.shape == case.q.shape and got.dtype == dtype
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.cpu().double(), case.expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("batch", BATCHES)
def test_matches_dense_attention(batch, page_size, group, dtype, device):
    case = make_case(BATCHES[batch], page_size, num_kv_heads=2, group=group, dtype=dtype, device=device)
    args = (case.q, case.k_cache, case.v_cache, case.inputs, case.scale)
    _check(paged_attention_reference(*args), case, dtype)
    _check(paged_attention(*args, CPU_ATTENTION if device == "cpu" else ONE_CALL_ATTENTION), case, dtype)


@pytest.mark.parametrize("budget, block_rows", [(1, 5), (40, 7), (10**9, 10**9)])
def test_chunking_and_row_blocks_do_not_change_results(budget, block_rows):
    seqs = BATCHES["mixed"] + BATCHES["decode"] + [(60, 23)]
    case = make_case(seqs, page_size=4, num_kv_heads=2, group=3, dtype=torch.float32, device="cpu", seed=1)
    policy = AttentionPolicy(budget, block_rows)
    _check(paged_attention(case.q, case.k_cache, case.v_cache, case.inputs, case.scale, policy), case, torch.float32)


def test_fused_decode_policy_needs_the_kernel():
    case = make_case(BATCHES["decode"], page_size=4, num_kv_heads=2, group=1, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="decode kernel"):
        paged_attention(case.q, case.k_cache, case.v_cache, case.inputs, case.scale,
                        AttentionPolicy(16, 16, fused_decode=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_smollm_decode_batch(dtype):
    """The shape the decode path was tuned on: 16 sequences, 100..1500 tokens, H=9, KVH=3, D=64."""
    lengths = torch.randint(100, 1501, (16,), generator=torch.Generator().manual_seed(2)).tolist()
    case = make_case([(n, 1) for n in lengths], 16, num_kv_heads=3, group=3, dtype=dtype, device="cpu", head_dim=64)
    _check(paged_attention(case.q, case.k_cache, case.v_cache, case.inputs, case.scale, CPU_ATTENTION), case, dtype)


def test_page_table_padding_value_is_irrelevant():
    case = make_case(BATCHES["mixed"], page_size=4, num_kv_heads=2, group=3, dtype=torch.float32, device="cpu")
    args = (case.q, case.k_cache, case.v_cache)
    before = paged_attention(*args, case.inputs, case.scale, CPU_ATTENTION)
    page_table = case.inputs.page_table.clone()
    num_pages = [math.ceil(c / 4) for c in case.inputs.context_lens]
    for b, n in enumerate(num_pages):
        page_table[b, n:] = case.k_cache.shape[0] - 1
    repadded = AttentionInputs(case.inputs.slot_ids, case.inputs.query_starts, case.inputs.context_lens, page_table)
    assert torch.equal(paged_attention(*args, repadded, case.scale, CPU_ATTENTION), before)


def test_rejects_q_that_does_not_fit():
    case = make_case(BATCHES["decode"], page_size=4, num_kv_heads=2, group=1, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError):
        paged_attention(case.q[:-1], case.k_cache, case.v_cache, case.inputs, case.scale, CPU_ATTENTION)


@pytest.mark.parametrize("device", DEVICES)
def test_store_kv_round_trip(device):
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.zeros(5, 4, 2, 8, device=device)
    v_cache = torch.zeros(5, 4, 2, 8, device=device)
    slot_ids = torch.tensor([13, 2, 19, 7], device=device)
    k = torch.randn(4, 2, 8, generator=gen).to(device)
    v = torch.randn(4, 2, 8, generator=gen).to(device)
    store_kv(k_cache, v_cache, k, v, slot_ids)
    assert torch.equal(k_cache[3, 1], k[0]) and torch.equal(v_cache[3, 1], v[0])  # slot 13 = page 3, offset 1
    assert torch.equal(k_cache.view(-1, 2, 8)[slot_ids], k)
    assert torch.equal(v_cache.view(-1, 2, 8)[slot_ids], v)
    untouched = torch.ones(20, dtype=torch.bool)
    untouched[slot_ids.cpu()] = False
    assert not k_cache.view(-1, 2, 8)[untouched.to(device)].any()


def test_store_kv_refuses_a_non_contiguous_cache():
    k_cache = torch.zeros(4, 5, 2, 8).transpose(0, 1)  # (5, 4, 2, 8) view, not contiguous
    with pytest.raises(RuntimeError):
        store_kv(k_cache, k_cache, torch.ones(1, 2, 8), torch.ones(1, 2, 8), torch.tensor([0]))


def test_short_chunks_after_a_prefix_run_as_decode_rows_in_the_fused_kernel(ops):
    """A speculative verify chunk (a few new tokens after a cached prefix) goes to the decode kernel, one
    row per token; cold prefills and longer chunks stay prefills. Same results as dense attention."""
    seqs = [(40, 5), (17, 1), (9, 9), (64, 16), (70, 17), (33, 2)]
    case = make_case(seqs, page_size=16, num_kv_heads=3, group=3, dtype=torch.float32, device="cpu", head_dim=64)
    policy = AttentionPolicy(CPU_ATTENTION.decode_token_budget, CPU_ATTENTION.prefill_block_rows, fused_decode=True,
                             max_rows_as_decode=16)
    plan = case.inputs.plan(16, policy)
    assert plan.decode_batch.rows.numel() == 5 + 1 + 16 + 2
    assert [(p.end - p.start) for p in plan.prefills] == [9, 17]
    _check(paged_attention(case.q, case.k_cache, case.v_cache, case.inputs, case.scale, policy, ops), case,
           torch.float32)


@pytest.mark.parametrize("window", [1, 5, 24, 1000])
@pytest.mark.parametrize("softcap", [None, 2.0])
@pytest.mark.parametrize("policy", [AttentionPolicy(40, 7), CPU_ATTENTION, ONE_CALL_ATTENTION], ids=["small", "cpu", "one"])
def test_sliding_window_and_soft_cap_match_the_reference(window, softcap, policy):
    seqs = BATCHES["mixed"] + [(60, 23), (70, 70)]
    case = make_case(seqs, page_size=4, num_kv_heads=2, group=3, dtype=torch.float32, device="cpu", seed=2)
    args = (case.q, case.k_cache, case.v_cache, case.inputs, case.scale)
    expected = paged_attention_reference(*args, window=window, softcap=softcap)
    got = paged_attention(*args, policy, window=window, softcap=softcap)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    if window == 1000 and softcap is None:  # a window wider than every context changes nothing
        _check(got, case, torch.float32)


def test_a_window_hides_exactly_the_keys_it_should():
    """Reference: a query at position p sees keys in (p - W, p]; here V is each key's position."""
    page_size, window, context_len = 4, 5, 13
    k_cache = torch.zeros(4, page_size, 1, 8)
    v_cache = torch.arange(16, dtype=torch.float32).view(4, page_size, 1, 1).expand(4, page_size, 1, 8).clone()
    inputs = AttentionInputs.build(list(range(context_len)), [context_len], [context_len], [[0, 1, 2, 3]], "cpu")
    q = torch.zeros(context_len, 1, 8)  # equal scores: the output is the mean visible position
    for fn in (paged_attention_reference, lambda *a, **kw: paged_attention(*a, CPU_ATTENTION, **kw)):
        out = fn(q, k_cache, v_cache, inputs, 1.0, window=window)[:, 0, 0]
        expected = torch.tensor([sum(range(max(0, p - window + 1), p + 1)) / min(p + 1, window)
                                 for p in range(context_len)])
        torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("window, softcap", [(5, None), (None, 2.0), (24, 2.0)])
def test_the_fused_decode_kernel_applies_windows_and_soft_caps(ops, window, softcap):
    """Decodes and short verify chunks (rows as decode) through the C kernel, prefills through SDPA."""
    seqs = BATCHES["mixed"] + [(60, 23), (41, 4), (100, 1)]
    case = make_case(seqs, page_size=4, num_kv_heads=2, group=3, dtype=torch.float32, device="cpu", seed=3)
    args = (case.q, case.k_cache, case.v_cache, case.inputs, case.scale)
    policy = AttentionPolicy(64, 16, fused_decode=True, max_rows_as_decode=4)
    got = paged_attention(*args, policy, ops, window=window, softcap=softcap)
    torch.testing.assert_close(got, paged_attention_reference(*args, window=window, softcap=softcap),
                               atol=1e-5, rtol=1e-5)
