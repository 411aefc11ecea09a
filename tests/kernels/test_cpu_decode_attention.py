"""Paged decode attention (kernels/cpu_decode_ops.py) against the torch reference."""

import ctypes

import pytest
import torch

from kernels.paged_attention import store_kv
from kernels.paged_attention_reference import paged_attention_reference
from kernels.rotary import RotaryEmbedding

HEADS = [(9, 3, 64), (4, 4, 32), (8, 2, 64), (8, 2, 32)]  # (H, KVH, D)


CONTEXTS = {
    "1": [1],
    "15": [15],
    "16": [16],
    "17": [17],
    "300": [300],
    "mixed": [300, 1, 17, 16, 15, 64, 65, 2],
    "long": [2100, 40],
}


@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim", HEADS)
@pytest.mark.parametrize("page_size", [16, 4])
@pytest.mark.parametrize("contexts", CONTEXTS.values(), ids=CONTEXTS.keys())
def test_decode_attention_matches_reference(ops, decode_case, num_threads, num_heads, num_kv_heads, head_dim,
                                            page_size, contexts):
    q, k_cache, v_cache, inputs, scale, expected = decode_case(
        contexts, page_size, num_heads, num_kv_heads, head_dim
    )
    num_seqs = len(contexts)
    # rows out of sequence order, two rows no sequence owns, and q a view of a qkv
    # tensor (row stride (H + 2 * KVH) * D), as the model holds it
    num_rows = num_seqs + 2
    rows = torch.randperm(num_rows, generator=torch.Generator().manual_seed(num_seqs))[:num_seqs]
    qkv = torch.randn(num_rows, num_heads + 2 * num_kv_heads, head_dim)
    qkv[rows, :num_heads] = q
    out = torch.full((num_rows, num_heads, head_dim), 7.0)
    context_lens = torch.tensor(inputs.context_lens, dtype=torch.int64)

    ops.paged_decode_attention(qkv[:, :num_heads], k_cache, v_cache, inputs.page_table, context_lens, rows, scale, out)
    torch.testing.assert_close(out[rows], expected, rtol=1e-5, atol=1e-5)
    unused = torch.ones(num_rows, dtype=torch.bool)
    unused[rows] = False
    assert torch.equal(out[unused], torch.full_like(out[unused], 7.0))


def test_decode_attention_32k_context(ops, decode_case, num_threads):
    q, k_cache, v_cache, inputs, scale, expected = decode_case([33000, 700], 16, 9, 3, 64, seed=1)
    out = torch.empty_like(q)
    context_lens = torch.tensor(inputs.context_lens)
    ops.paged_decode_attention(q, k_cache, v_cache, inputs.page_table, context_lens, torch.arange(2), scale, out)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_decode_attention_peaked_scores(ops, decode_case, num_threads):
    """Large logits: the running max must keep the softmax finite and exact."""
    q, k_cache, v_cache, inputs, _, _ = decode_case([700, 5], 16, 8, 2, 32, seed=2)
    scale = 3.0  # logits in the hundreds
    expected = paged_attention_reference(q, k_cache, v_cache, inputs, scale)
    out = torch.empty_like(q)
    context_lens = torch.tensor(inputs.context_lens)
    ops.paged_decode_attention(q, k_cache, v_cache, inputs.page_table, context_lens, torch.arange(2), scale, out)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_decode_attention_after_rope_store_kv(ops, decode_case):
    """The two ops chained as a decode step runs them: rope + store, then attention
    on a q view of the same qkv, against the torch ops."""
    num_heads, num_kv_heads, head_dim, page_size = 9, 3, 64, 16
    context_lens = [40, 17, 1]
    _, k_cache, v_cache, inputs, scale, _ = decode_case(context_lens, page_size, num_heads, num_kv_heads, head_dim)
    rotary = RotaryEmbedding(head_dim, 128, 10000.0, None, "cpu")
    cos, sin = rotary.cos_sin(inputs.positions, torch.float32)
    qkv = torch.randn(3, num_heads + 2 * num_kv_heads, head_dim)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()

    qk = RotaryEmbedding.apply(qkv[:, : num_heads + num_kv_heads], cos, sin)
    store_kv(k_ref, v_ref, qk[:, num_heads:], qkv[:, num_heads + num_kv_heads :], inputs.slot_ids)
    expected = paged_attention_reference(qk[:, :num_heads], k_ref, v_ref, inputs, scale)

    ops.rope_store_kv(qkv, cos, sin, k_cache, v_cache, inputs.slot_ids)
    out = torch.empty(3, num_heads, head_dim)
    context_lens = torch.tensor(context_lens)
    ops.paged_decode_attention(qkv[:, :num_heads], k_cache, v_cache, inputs.page_table, context_lens,
                               torch.arange(3), scale, out)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


class _KVPages(ctypes.Structure):
    """kernels/csrc/kv_formats.h's kv_pages (format 0: float32)."""

    _fields_ = [("values", ctypes.c_void_p), ("scales", ctypes.c_void_p), ("format", ctypes.c_int64)]


def test_unpacked_decode_attention(ops, decode_case):
    """The library's plain C signature (what the packed entry point forwards to)."""
    lib = ops.library
    P, I = ctypes.c_void_p, ctypes.c_int64
    lib.paged_decode_attention.argtypes = [P, I, _KVPages, _KVPages, P, I, P, P, I, I, I, I, I, ctypes.c_float, P, I,
                                           I, ctypes.c_int, I, ctypes.c_float]
    lib.paged_decode_attention.restype = ctypes.c_int64
    q, k_cache, v_cache, inputs, scale, expected = decode_case([40, 3], 16, 9, 3, 64)
    context_lens, rows, out = torch.tensor(inputs.context_lens), torch.arange(2), torch.empty(2, 9, 64)
    status = lib.paged_decode_attention(
        q.data_ptr(), 9 * 64, _KVPages(k_cache.data_ptr(), None, 0), _KVPages(v_cache.data_ptr(), None, 0),
        inputs.page_table.data_ptr(), inputs.page_table.shape[1], context_lens.data_ptr(), rows.data_ptr(), 2, 9, 3,
        64, 16, scale, out.data_ptr(), 2, k_cache.shape[0], 2, 0, 0.0)
    assert status == 0
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------- bad inputs


def _attention_inputs(decode_case):
    q, k_cache, v_cache, inputs, scale, _ = decode_case([20, 5], 16, 9, 3, 64)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, page_table=inputs.page_table,
                context_lens=torch.tensor(inputs.context_lens), rows=torch.arange(2), scale=scale,
                out=torch.zeros(2, 9, 64))


def test_decode_attention_rejects_bad_inputs(ops, decode_case):
    good = _attention_inputs(decode_case)
    ops.paged_decode_attention(**good)
    num_pages = good["k_cache"].shape[0]
    changes = {
        "q dtype": dict(q=good["q"].double()),
        "q head stride": dict(q=torch.randn(2, 64, 9).transpose(1, 2)),
        "q inner stride": dict(q=torch.randn(2, 9, 128)[:, :, ::2]),
        "q heads not in groups": dict(q=torch.randn(2, 8, 64), out=torch.zeros(2, 8, 64)),
        "q head_dim": dict(q=torch.randn(2, 9, 32), out=torch.zeros(2, 9, 32)),
        "too many heads": dict(q=torch.randn(2, 129, 64), out=torch.zeros(2, 129, 64)),
        "out shape": dict(out=torch.zeros(3, 9, 64)),
        "out dtype": dict(out=torch.zeros(2, 9, 64, dtype=torch.float64)),
        "out not contiguous": dict(out=torch.zeros(9, 2, 64).transpose(0, 1)),
        "cache not contiguous": dict(v_cache=good["v_cache"].transpose(0, 1).contiguous().transpose(0, 1)),
        "page_table dtype": dict(page_table=good["page_table"].int()),
        "page_table rows": dict(page_table=good["page_table"][:1]),
        "context_lens dtype": dict(context_lens=torch.tensor([20, 5], dtype=torch.int32)),
        "context_lens count": dict(context_lens=torch.tensor([20])),
        "rows not contiguous": dict(rows=torch.tensor([0, 9, 1])[::2]),
        "row outside q": dict(rows=torch.tensor([0, 2])),
        "negative row": dict(rows=torch.tensor([-1, 1])),
        "empty context": dict(context_lens=torch.tensor([20, 0])),
        "context beyond page table": dict(context_lens=torch.tensor([20, 33])),
        "page id outside cache": dict(page_table=torch.tensor([[0, 1], [num_pages, 0]])),
        "negative page id": dict(page_table=torch.tensor([[0, -1], [2, 0]])),
    }
    for name, change in changes.items():
        inputs = {**_attention_inputs(decode_case), **change}
        out_before = inputs["out"].clone()
        with pytest.raises(ValueError):
            ops.paged_decode_attention(**inputs)
        assert torch.equal(inputs["out"], out_before), name


@pytest.mark.parametrize("verify_context", [5, 16, 64, 300, 700])
def test_a_rows_result_does_not_depend_on_the_batch(ops, decode_case, num_threads, verify_context):
    """A verify chunk's rows (one sequence's consecutive positions: context c, c + 1, ..., the same
    pages; the kernel attends them in one pass) get the very bits each gets alone, as a plain
    decode of that position does, and so does a row beside a long sequence of another request."""
    num_verify_rows, page_size = 5, 16
    q, k_cache, v_cache, inputs, scale, _ = decode_case([verify_context + num_verify_rows - 1, 1500], page_size,
                                                        9, 3, 64, seed=verify_context)
    verify_pages = inputs.page_table[0]
    page_table = torch.cat([verify_pages.expand(num_verify_rows, -1), inputs.page_table[1:]]).contiguous()
    context_lens = torch.tensor([verify_context + i for i in range(num_verify_rows)] + [inputs.context_lens[1]])
    queries = torch.randn(num_verify_rows + 1, 9, 64, generator=torch.Generator().manual_seed(3))
    together = torch.empty_like(queries)
    ops.paged_decode_attention(queries, k_cache, v_cache, page_table, context_lens,
                               torch.arange(num_verify_rows + 1), scale, together)
    for row in range(num_verify_rows + 1):
        alone = torch.empty_like(queries[row:row + 1])
        ops.paged_decode_attention(queries[row:row + 1].contiguous(), k_cache, v_cache,
                                   page_table[row:row + 1].contiguous(), context_lens[row:row + 1],
                                   torch.zeros(1, dtype=torch.int64), scale, alone)
        assert torch.equal(together[row], alone[0]), row
    reference = paged_attention_reference(
        queries[:1], k_cache, v_cache,
        type(inputs).build([0], [1], [verify_context], [verify_pages.tolist()], "cpu"), scale)
    torch.testing.assert_close(together[:1], reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [None, 1, 16, 70, 5000])
@pytest.mark.parametrize("softcap", [None, 3.0])
def test_decode_attention_with_a_window_and_a_soft_cap(ops, decode_case, num_threads, window, softcap):
    """Long contexts are cut into pieces over the window's span; the rows of a verify chunk start apart."""
    q, k_cache, v_cache, inputs, scale, _ = decode_case(CONTEXTS["mixed"] + [2100], 4, 8, 2, 32, seed=4)
    expected = paged_attention_reference(q, k_cache, v_cache, inputs, scale, window=window, softcap=softcap)
    out = torch.empty_like(q)
    ops.paged_decode_attention(q, k_cache, v_cache, inputs.page_table, torch.tensor(inputs.context_lens),
                               torch.arange(q.shape[0]), scale, out, window, softcap)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
