"""bench/kv_dtype_quality.py's bookkeeping (no model): which reference each variant is compared against,
the order variants run in, and the results file's summary, old lines (no "reference") included."""

import json

from bench.kv_dtype_quality import EXACT, REUSE_EXACT, _ordered_variants, _print_file_summary, _references_of


def test_a_quantized_dtype_with_reuse_on_runs_after_float32_with_reuse_on():
    assert _ordered_variants(["int8:off", "int8:on"]) == ["float32:on", "int8:off", "int8:on"]
    assert _ordered_variants(["bfloat16:on", "float32:on", "int8:on"]) == ["float32:on", "bfloat16:on", "int8:on"]
    assert _ordered_variants(["int8:off", "bfloat16:off"]) == ["int8:off", "bfloat16:off"]
    assert _ordered_variants(["float32:on"]) == ["float32:on"]


def test_reuse_on_is_compared_against_both_references():
    assert _references_of("int8:on") == (EXACT, REUSE_EXACT) == ("float32:off", "float32:on")
    assert _references_of("int8:off") == (EXACT,)
    assert _references_of("float32:on") == (EXACT,)


def test_the_file_summary_keeps_each_reference_apart(tmp_path, capsys):
    def line(variant, prompt, num_agree, reference=None):
        record = dict(variant=variant, num_prompts=200, seed=0, prompt=prompt, first_same=True, num_rows=10,
                      num_agree=num_agree, kl_sum=0.5)
        return json.dumps(record if reference is None else {**record, "reference": reference})

    path = tmp_path / "results.jsonl"
    path.write_text("\n".join([
        line("int8:on", 100, 5),  # an old line: against float32:off
        line("int8:on", 100, 9, "float32:off"),  # the same prompt again: the last counts
        line("int8:on", 101, 7, "float32:off"),
        line("int8:on", 100, 10, "float32:on"),
        line("int8:on", 101, 10, "float32:on"),
    ]) + "\n")
    _print_file_summary(path, 200, 0)
    rows = [row.split() for row in capsys.readouterr().out.splitlines()[2:]]
    assert rows == [["int8", "on", "float32:off", "2", "1.0000", "0.8000", "5.00e-02"],
                    ["int8", "on", "float32:on", "2", "1.0000", "1.0000", "5.00e-02"]]


def test_equal_tokens_sizes_each_format_for_float32s_token_count(tmp_path):
    from bench.kv_dtype_quality import _bytes_of

    (tmp_path / "config.json").write_text(json.dumps(dict(
        architectures=["LlamaForCausalLM"], hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
        num_hidden_layers=2, intermediate_size=256, vocab_size=64)))
    # head_dim 64: float32 256 bytes a (token, head), bfloat16 128, int8 64 + a 4-byte scale
    assert _bytes_of(tmp_path, "int8", 256 << 20, equal_tokens=False) == 256 << 20
    assert _bytes_of(tmp_path, "float32", 256 << 20, equal_tokens=True) == 256 << 20
    assert _bytes_of(tmp_path, "bfloat16", 256 << 20, equal_tokens=True) == 128 << 20
    assert _bytes_of(tmp_path, "int8", 256 << 20, equal_tokens=True) == 68 << 20


def test_the_file_summary_counts_one_backends_lines(tmp_path, capsys):
    """--backend torch lines (float8's) and cpu lines (no "backend": older ones) in one file never mix."""
    def line(variant, num_agree, backend=None):
        record = dict(variant=variant, reference="float32:off", num_prompts=40, seed=0, prompt=0, first_same=True,
                      num_rows=10, num_agree=num_agree, kl_sum=0.5)
        return json.dumps(record if backend is None else {**record, "backend": backend})

    path = tmp_path / "results.jsonl"
    path.write_text("\n".join([line("int8:off", 10), line("int8:off", 6, "torch"), line("float8:off", 8, "torch"),
                               line("int8:off", 9, "cpu")]) + "\n")
    _print_file_summary(path, 40, 0, "torch")
    rows = [row.split()[:6] for row in capsys.readouterr().out.splitlines()[2:]]
    assert rows == [["int8", "off", "float32:off", "1", "1.0000", "0.6000"],
                    ["float8", "off", "float32:off", "1", "1.0000", "0.8000"]]
    _print_file_summary(path, 40, 0)  # auto: the cpu backend's, the line without "backend" included
    rows = [row.split()[:6] for row in capsys.readouterr().out.splitlines()[2:]]
    assert rows == [["int8", "off", "float32:off", "1", "1.0000", "0.9000"]]


def test_the_exact_cache_keeps_backends_apart(tmp_path):
    import torch

    from bench.document_reuse_exact_cache import ExactAnswer, load_exact_answers, save_exact_answers

    path = tmp_path / "exact.pt"
    prompts = [[1, 2, 3]]
    save_exact_answers(path, prompts, [ExactAnswer([4], "", torch.zeros(2, 3), 0)], "c", 1.0)
    assert len(load_exact_answers(path, prompts)[0]) == 1
    assert load_exact_answers(path, prompts, "backend torch:")[0] == []
    save_exact_answers(path, prompts, [ExactAnswer([5], "", torch.ones(2, 3), 0)], "c", 1.0, "backend torch:")
    assert load_exact_answers(path, prompts, "backend torch:")[0][0].answer_ids == [5]
    assert load_exact_answers(path, prompts)[0][0].answer_ids == [4]
