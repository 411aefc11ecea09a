"""The speed bench's arithmetic: the FLOPs it charges a prefill token, and the KV bytes both servers get."""

from bench.cpu_speed_bench import CONTEXT, NUM_SLOTS, linear_weight_elements, llama_kv_bytes

# SmolLM2-135M's GGUF metadata, the keys the bench reads
SMOLLM2 = {"general.architecture": "llama", "llama.embedding_length": 576, "llama.feed_forward_length": 1536,
           "llama.block_count": 30, "llama.attention.head_count": 9, "llama.attention.head_count_kv": 3}


def test_linear_weights_are_the_model_without_its_embedding():
    # q (576x576), k and v (192x576 each), o (576x576), gate, up, down (1536x576 each), 30 layers
    assert linear_weight_elements(SMOLLM2) == 30 * (576 * 960 + 576 * 576 + 3 * 576 * 1536) == 106_168_320


def test_kv_bytes_are_llama_servers_f16_cache():
    assert llama_kv_bytes(SMOLLM2) == 2 * 30 * NUM_SLOTS * CONTEXT * 3 * 64 * 2


def test_a_row_per_prefill_path_and_bf16_missing_is_said(monkeypatch):
    import pytest

    from bench import cpu_speed_bench
    from kernels.cpu_features import CpuFeatures

    monkeypatch.setattr(cpu_speed_bench, "this_cpu", lambda: CpuFeatures("x86_64", frozenset({"avx2", "fma", "f16c"})))
    rows, missing = cpu_speed_bench.radixserve_rows(["float32", "bf16", "int8"])
    assert rows == {"radixserve float32": ["--prefill-dtype", "float32", "--no-int8-activations"],
                    "radixserve int8": ["--int8-activations"]}
    assert missing == ["radixserve bf16: not run (bfloat16 prefill needs native bf16 (this CPU lacks "
                       "AVX512_BF16/AMX-BF16))"]
    with pytest.raises(SystemExit, match="--paths takes"):
        cpu_speed_bench.radixserve_rows(["fp8"])
