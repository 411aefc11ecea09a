import pytest
import torch

from kernels.attention_inputs import AttentionInputs
from kernels.attention_plan import CPU_ATTENTION, ONE_CALL_ATTENTION, _pack_by_length


def _mixed() -> AttentionInputs:
    # seq 0: prefill of 3 after a 2-token prefix; seq 1: decode at position 4; seq 2: cold prefill of 2
    return AttentionInputs.build(
        slot_ids=[10, 11, 12, 5, 20, 21],
        query_lens=[3, 1, 2],
        context_lens=[5, 5, 2],
        page_ids_per_seq=[[2, 3], [1, 4], [5]],
        device="cpu",
    )


def test_build_from_lists():
    inputs = _mixed()
    assert inputs.query_starts == [0, 3, 4, 6]
    assert inputs.query_lens == [3, 1, 2]
    assert inputs.num_seqs == 3 and inputs.num_tokens == 6
    assert inputs.max_context_len == 5
    assert inputs.page_table.tolist() == [[2, 3], [1, 4], [5, 0]]  # padded with page 0
    assert inputs.slot_ids.dtype == inputs.page_table.dtype == torch.int64


def test_positions_are_the_last_query_len_positions_of_each_context():
    assert _mixed().positions.tolist() == [2, 3, 4, 4, 0, 1]


def test_decode_only():
    inputs = AttentionInputs.build([3, 9], [1, 1], [4, 2], [[0], [2]], "cpu")
    assert inputs.query_lens == [1, 1]
    assert inputs.positions.tolist() == [3, 1]


def test_plan_is_built_once_per_page_size():
    inputs = _mixed()
    assert inputs.plan(4, CPU_ATTENTION) is inputs.plan(4, CPU_ATTENTION)
    assert inputs.plan(4, CPU_ATTENTION) is not inputs.plan(16, CPU_ATTENTION)
    assert inputs.plan(4, CPU_ATTENTION) is not inputs.plan(4, ONE_CALL_ATTENTION)


def test_plan_splits_decodes_from_prefills():
    plan = _mixed().plan(4, CPU_ATTENTION)
    assert [(p.start, p.end) for p in plan.prefills] == [(0, 3), (4, 6)]
    assert plan.prefills[0].slot_ids.tolist() == [8, 9, 10, 11, 12]  # pages 2, 3 of size 4
    assert plan.prefills[0].mask.tolist() == [
        [True, True, True, False, False],
        [True, True, True, True, False],
        [True, True, True, True, True],
    ]
    assert plan.prefills[1].mask is None  # cold prefill: plain causal
    (chunk,) = plan.decode_chunks
    assert chunk.rows.tolist() == [3]
    assert chunk.slot_ids.tolist() == [4, 5, 6, 7, 16]
    assert chunk.mask is None  # a lone sequence has no padding


def test_prompt_chunks_go_to_prefill_however_few_their_rows_under_prompts_as_prefill():
    """A 1-row prompt chunk after a cached prefix and a 3-row one: the decode kernel by default, the prefill
    path with prompts_as_prefill (bf16 products); a decode and a verify chunk stay decode rows either way."""
    import dataclasses

    fused = dataclasses.replace(CPU_ATTENTION, fused_decode=True, fused_prefill=True, max_rows_as_decode=16)
    # seqs: prompt tail of 1 row, prompt chunk of 3 rows, a decode, a verify chunk of 3 rows
    inputs = AttentionInputs.build([10, 11, 12, 13, 5, 20, 21, 22], [1, 3, 1, 3], [9, 12, 5, 7],
                                   [[2, 3, 6], [4, 7, 8], [1, 9], [5, 10]], "cpu",
                                   num_generated=[0, 0, 1, 3])
    by_count = inputs.plan(4, fused)
    assert by_count.prefill_batch is None and by_count.decode_batch.rows.tolist() == list(range(8))
    prompts = inputs.plan(4, dataclasses.replace(fused, prompts_as_prefill=True))
    assert prompts.prefill_batch.q_starts.tolist() == [0, 1] and prompts.prefill_batch.query_lens.tolist() == [1, 3]
    assert prompts.decode_batch.rows.tolist() == [4, 5, 6, 7]
    assert inputs.prompt_rows.tolist() == [0, 1, 2, 3] and inputs.generated_rows.tolist() == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="num_generated"):
        AttentionInputs.build([0], [1], [1], [[0]], "cpu", num_generated=[0, 0])
    with pytest.raises(ValueError, match="num_generated"):
        AttentionInputs.build([0], [1], [1], [[0]], "cpu", num_generated=[2])


@pytest.mark.parametrize(
    "bad",
    [
        dict(query_lens=[3, 1, 2], context_lens=[2, 5, 2]),  # more new tokens than context
        dict(query_lens=[3, 0, 3], context_lens=[5, 5, 3]),  # empty query
    ],
)
def test_rejects_inconsistent_lengths(bad):
    with pytest.raises(ValueError):
        AttentionInputs.build([0] * 6, bad["query_lens"], bad["context_lens"], [[0, 1], [2, 3], [4]], "cpu")


def test_rejects_page_table_of_wrong_batch():
    inputs = _mixed()
    with pytest.raises(ValueError):
        AttentionInputs(inputs.slot_ids, inputs.query_starts, inputs.context_lens, inputs.page_table[:2])


def test_pack_by_length_sorts_and_respects_budget():
    lens = [500, 10, 300, 20, 2000, 15]
    groups = _pack_by_length(list(range(6)), lens, budget=1000)
    assert sorted(b for g in groups for b in g) == list(range(6))
    flat = [lens[b] for g in groups for b in g]
    assert flat == sorted(flat)
    for g in groups:
        assert len(g) == 1 or len(g) * max(lens[b] for b in g) <= 1000
    assert [4] in groups  # longer than the budget: alone
