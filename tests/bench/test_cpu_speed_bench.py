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
