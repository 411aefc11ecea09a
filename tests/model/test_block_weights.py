"""A GGUF model whose weights are every block type the CPU kernels read, end to end: converted with
no float32 copy of them, loaded by the cpu backend as blocks (decode on the C kernels, prefill on
dequantized tiles, the embedding's rows dequantized), and greedy outputs equal to the same model
dequantized to float32 at load."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from safetensors import safe_open

from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.speculation_config import SpeculationConfig
from kernels.block_formats import FORMATS
from model.backends import decode_copies
from store.block_file import BLOCKS_FILE, block_entries, read_block_file
from store.gguf_import import convert_gguf, read_metadata
from tests.kernels.test_block_matmul import random_gguf_rows

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS = 256, 512, 4, 2
# Each matrix in another format, so one model covers them all (F32 stays a float32 tensor).
LAYER_FORMATS = [
    {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q5_K",
     "ffn_gate": "Q3_K", "ffn_up": "Q2_K", "ffn_down": "Q4_0"},
    {"attn_q": "Q5_0", "attn_k": "Q5_1", "attn_v": "Q8_0", "attn_output": "Q4_1",
     "ffn_gate": "F16", "ffn_up": "BF16", "ffn_down": "Q6_K"},
]


def _random_rows(format_name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    if format_name in ("F16", "BF16"):  # small values, like the quantized ones
        values = np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32) * 0.05
        from gguf.quants import quantize
        return quantize(values, GGMLQuantizationType[format_name]).view(np.uint8).reshape(rows, -1)
    return random_gguf_rows(format_name, rows, cols, seed)


def write_block_model(path, tokenizer_source, tie: bool, embedding_format: str) -> None:
    metadata = read_metadata(GGUFReader(tokenizer_source))
    tokens = metadata["tokenizer.ggml.tokens"]
    writer = GGUFWriter(path, "llama")
    writer.add_block_count(len(LAYER_FORMATS))
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([int(t) for t in metadata["tokenizer.ggml.token_type"]])
    writer.add_token_merges(list(metadata["tokenizer.ggml.merges"]))
    for key in ("bos", "eos", "unk", "pad"):
        field = {"unk": "unknown", "pad": "padding"}.get(key, key)
        getattr(writer, f"add_{key}_token_id")(int(metadata[f"tokenizer.ggml.{field}_token_id"]))
    head_dim = HIDDEN // HEADS
    seed = 0

    def add(name: str, format_name: str, rows: int, cols: int) -> None:
        nonlocal seed
        seed += 1
        writer.add_tensor(name, _random_rows(format_name, rows, cols, seed), raw_dtype=GGMLQuantizationType[format_name])

    add("token_embd.weight", embedding_format, len(tokens), HIDDEN)
    for i, formats in enumerate(LAYER_FORMATS):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        shapes = {"attn_q": (HEADS * head_dim, HIDDEN), "attn_k": (KV_HEADS * head_dim, HIDDEN),
                  "attn_v": (KV_HEADS * head_dim, HIDDEN), "attn_output": (HIDDEN, HEADS * head_dim),
                  "ffn_gate": (INTERMEDIATE, HIDDEN), "ffn_up": (INTERMEDIATE, HIDDEN),
                  "ffn_down": (HIDDEN, INTERMEDIATE)}
        for stem, format_name in formats.items():
            add(f"blk.{i}.{stem}.weight", format_name, *shapes[stem])
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    if not tie:
        add("output.weight", "Q6_K", len(tokens), HIDDEN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _engine(model_dir, backend: str, gguf_blocks: bool = True, float_prefill_max_bytes: int = 0,
            decode_activations: str = "float32") -> LLMEngine:
    return LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", kv_cache_bytes=16 << 20,
                                  max_num_batched_tokens=2048, gguf_blocks=gguf_blocks, backend=backend,
                                  few_rows_crossover="fixed", speculation=SpeculationConfig("off"),
                                  float_prefill_max_bytes=float_prefill_max_bytes,
                                  decode_activations=decode_activations,
                                  # float32 products throughout: the greedy answers are compared with the torch
                                  # backend's over the dequantized weights (bf16 prefill: tests/engine/test_bf16_prefill.py)
                                  prefill_dtype="float32"))


@pytest.mark.parametrize("tie, embedding_format", [(True, "Q6_K"), (False, "F16")])
def test_every_block_type_runs_as_blocks_and_matches_dequantized(tmp_path, tiny_gguf, tie, embedding_format):
    tiny_gguf(tmp_path / "tokenizer.gguf")
    write_block_model(tmp_path / "blocks.gguf", tmp_path / "tokenizer.gguf", tie, embedding_format)
    model_dir = convert_gguf(tmp_path / "blocks.gguf", tmp_path / "model", progress=False)
    with safe_open(str(model_dir / "model.safetensors"), "pt") as file:
        assert all(name.endswith("norm.weight") for name in file.keys())  # no float32 copy of a matrix
    assert {b.format for b in read_block_file(model_dir).values()} == set(FORMATS) - {"F32"}

    on_blocks = _engine(model_dir, "cpu")
    plan = on_blocks.backend.plan()
    assert "Q4_K+Q6_K blocks" in plan.linears["layers.0.self_attn.qkv_proj"].few_rows  # fused across formats
    assert "Q3_K+Q2_K blocks" in plan.linears["layers.0.mlp.gate_up_proj"].few_rows
    description = on_blocks.backend.describe()
    assert "weights resident as blocks" in description and f"embedding: {embedding_format} blocks" in description
    assert not [name for name, p in on_blocks.model.named_parameters() if p.dim() == 2]  # nothing float32 2-D
    assert "float32 copies" not in description  # prefill over tiles (a budget of 0)
    dequantized = _engine(model_dir, "cpu", gguf_blocks=False)
    assert "dequantized to float32 at load" in dequantized.backend.describe()
    reference = _engine(model_dir, "torch")
    assert "dequantized to float32 at load" in reference.backend.describe()

    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(3, 250, size)] for size in (3, 17, 40)]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    expected = reference.generate(prompts, params)
    assert dequantized.generate(prompts, params) == expected
    assert on_blocks.generate(prompts, params) == expected  # batched: decode rows share the kernels
    assert [on_blocks.generate([p], params)[0] for p in prompts] == expected  # one at a time
    # A model this small keeps a float32 copy of its projections for prefill (decode still reads the blocks).
    with_copy = _engine(model_dir, "cpu", float_prefill_max_bytes=1 << 30)
    assert "prefill over float32 copies of the projections" in with_copy.backend.describe()
    assert "oneDNN prepacked over a float32 copy" in with_copy.backend.plan().linears["layers.1.mlp.down_proj"].large
    assert with_copy.generate(prompts, params) == expected

    on_int16 = _engine(model_dir, "cpu", decode_activations="int16")  # every format through matmul_q16
    assert "int16 activations" in on_int16.backend.plan().linears["layers.0.mlp.gate_up_proj"].few_rows
    batched = on_int16.generate(prompts, params)
    assert [on_int16.generate([p], params)[0] for p in prompts] == batched  # a path agrees with itself
    if on_int16.backend.decode_copies.kernels is not None:  # the Q4_1 projection decodes over its interleaved copy
        assert "interleaved" in on_int16.backend.plan().linears["layers.1.self_attn.o_proj"].few_rows
        qkv = on_int16.backend.plan().linears["layers.0.self_attn.qkv_proj"].few_rows  # Q4_K q+k, Q6_K v
        copied = on_int16.backend.decode_copies.kernels.q16_formats
        if "Q6_K" in copied:  # the AVX2 build copies Q6_K too
            assert "interleaved by 8, avx2) over Q4_K+Q6_K blocks" in qkv
            assert "decode over a copy of the Q4_1 / Q4_K / Q6_K projections" in on_int16.backend.describe()
        else:
            assert "for its Q4_K parts; the rest C block matmul" in qkv
            assert "decode over a copy of the Q4_1 / Q4_K projections" in on_int16.backend.describe()


def test_int16_decode_over_interleaved_copies_keeps_to_its_budget(tmp_path, tiny_gguf, monkeypatch):
    """The projections decode over a copy in interleaved rows where the copies held beside their blocks fit in the
    budget, over the blocks past it (said in describe()), and each way agrees with itself batched and alone. A copy
    whose blocks are released (float32 prefill on the FMA GEMM reads it too) costs the budget nothing."""
    tiny_gguf(tmp_path / "tokenizer.gguf")
    write_block_model(tmp_path / "blocks.gguf", tmp_path / "tokenizer.gguf", True, "Q8_0")
    model_dir = convert_gguf(tmp_path / "blocks.gguf", tmp_path / "model", progress=False)
    rng = np.random.default_rng(1)
    prompts = [[int(t) for t in rng.integers(3, 250, size)] for size in (5, 30)]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    with_copy = _engine(model_dir, "cpu", decode_activations="int16")
    if with_copy.backend.decode_copies.kernels is None:
        pytest.skip("the interleaved-rows kernels do not run here: " + "; ".join(with_copy.backend.fallbacks))
    copied = with_copy.backend.decode_copies.kernels.q16_formats
    # prefill over float32 copies of the projections: no blocks are released, every decode copy is held beside them
    beside = {"decode_activations": "int16", "float_prefill_max_bytes": 1 << 30}
    monkeypatch.setattr(decode_copies, "DECODE_COPY_MAX_BYTES", 1)
    over_blocks = _engine(model_dir, "cpu", **beside)
    assert "decode over a copy" not in over_blocks.backend.describe()
    assert "MiB beside their blocks, over 0 MiB" in over_blocks.backend.describe()
    assert "interleaved" not in over_blocks.backend.plan().linears["layers.1.self_attn.o_proj"].few_rows
    engines = [with_copy, over_blocks]
    if with_copy.backend.fma_gemm is not None:  # an AVX2 machine: the FMA GEMM reads the copies, their blocks go
        released = _engine(model_dir, "cpu", decode_activations="int16")
        description = released.backend.describe()
        assert f"decode over a copy of the {' / '.join(copied)} projections" in description
        assert "0 MiB of it beside blocks" in description and "their blocks released" in description
        assert "interleaved" in released.backend.plan().linears["layers.1.self_attn.o_proj"].few_rows
        engines.append(released)
    if "Q6_K" in copied:
        # a budget that holds the Q4_1 / Q4_K projections but not the Q6_K ones too: those alone are copied
        entries = block_entries(model_dir / BLOCKS_FILE)
        q4_bytes = sum(e.rows * e.cols // FORMATS[e.format].block_size * FORMATS[e.format].bytes  # as held
                       for name, e in entries.items() if e.format in ("Q4_1", "Q4_K") and "embed" not in name)
        monkeypatch.setattr(decode_copies, "DECODE_COPY_MAX_BYTES", q4_bytes)
        q4_only = _engine(model_dir, "cpu", **beside)
        assert "decode over a copy of the Q4_1 / Q4_K projections" in q4_only.backend.describe()
        assert "int16 decode over the Q6_K blocks" in q4_only.backend.describe()
        assert "for its Q4_K parts; the rest C block matmul" in q4_only.backend.plan().linears["layers.0.self_attn.qkv_proj"].few_rows
        engines.append(q4_only)
    for engine in engines:
        batched = engine.generate(prompts, params)
        assert [engine.generate([p], params)[0] for p in prompts] == batched


def test_blocks_file_is_read_without_the_float32_file_growing(tmp_path, tiny_gguf):
    """The converted directory's weights are about the GGUF's size, not float32's."""
    tiny_gguf(tmp_path / "tokenizer.gguf")
    write_block_model(tmp_path / "blocks.gguf", tmp_path / "tokenizer.gguf", True, "Q6_K")
    model_dir = convert_gguf(tmp_path / "blocks.gguf", tmp_path / "model", progress=False)
    gguf_bytes = (tmp_path / "blocks.gguf").stat().st_size
    assert (model_dir / BLOCKS_FILE).stat().st_size < gguf_bytes
    assert (model_dir / "model.safetensors").stat().st_size < 16 * 1024
