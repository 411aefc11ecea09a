"""Random GGUF models in a real model's shapes, for memory and speed benches on real-sized files.

    python -m bench.random_gguf --shape llama-3.2-1b --types Q4_K_M,Q8_0

writes (once; later runs print the cached paths) under $RADIXSERVE_HOME/bench-models:
    <shape>-random-F16.gguf        written here with the `gguf` package: random weights, the
                                   default model's tokenizer padded to the shape's vocabulary
    <shape>-random-<TYPE>.gguf     made from it by llama.cpp's own `llama-quantize`
and prints one path per requested type. llama-quantize is found as the tests find it
(tests/llama_tools.py: $RADIXSERVE_LLAMA_CPP_DIR, else the build under $RADIXSERVE_HOME/peers;
`make llama-tools` builds it).

The weights are seeded normals (std 0.02, norms 1), so the files are the same on every machine;
the model talks nonsense, which a memory or tokens/s bench does not mind. No llama3 per-frequency
rope factors (rope_freqs.weight) are written: the shape, not the rope, is what these files are for.
"""

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, TokenType

from store.gguf_import import read_metadata
from store.model_store import extract_gguf, radixserve_home

LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # bench/build_llama_server.sh's default, as tests/llama_tools.py
WEIGHT_STD = 0.02
SEED = 0


@dataclass(frozen=True)
class ModelShape:
    """A Llama-architecture model's shapes (GGUF metadata names in comments)."""

    hidden: int  # embedding_length
    layers: int  # block_count
    heads: int  # attention.head_count
    kv_heads: int  # attention.head_count_kv
    head_dim: int  # attention.key_length / value_length
    intermediate: int  # feed_forward_length
    vocab: int
    tied_embeddings: bool
    rope_theta: float
    context: int = 131072
    rms_eps: float = 1e-5


SHAPES = {
    "llama-3.2-1b": ModelShape(hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, intermediate=8192,
                               vocab=128256, tied_embeddings=True, rope_theta=500000.0),
    "llama-3.2-3b": ModelShape(hidden=3072, layers=28, heads=24, kv_heads=8, head_dim=128, intermediate=8192,
                               vocab=128256, tied_embeddings=True, rope_theta=500000.0),
    "llama-3.1-8b": ModelShape(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, intermediate=14336,
                               vocab=128256, tied_embeddings=False, rope_theta=500000.0),
    # small enough for tests: every matrix width a multiple of 256 (the K-quants' super-block)
    "tiny": ModelShape(hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, intermediate=512,
                       vocab=49152, tied_embeddings=True, rope_theta=500000.0, context=4096),
}


def bench_models_dir() -> Path:
    return radixserve_home() / "bench-models"


def llama_quantize_path() -> Path:
    given = os.environ.get("RADIXSERVE_LLAMA_CPP_DIR")
    source = Path(given).expanduser() if given else (
        radixserve_home() / "peers" / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}" / "vendor" / "llama.cpp")
    return source / "build" / "bin" / "llama-quantize"


def tensor_shapes(shape: ModelShape) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, row-major shape) of every tensor, in llama.cpp's order."""
    q_rows, kv_rows = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    tensors = [("token_embd.weight", (shape.vocab, shape.hidden))]
    for i in range(shape.layers):
        tensors += [
            (f"blk.{i}.attn_norm.weight", (shape.hidden,)),
            (f"blk.{i}.attn_q.weight", (q_rows, shape.hidden)),
            (f"blk.{i}.attn_k.weight", (kv_rows, shape.hidden)),
            (f"blk.{i}.attn_v.weight", (kv_rows, shape.hidden)),
            (f"blk.{i}.attn_output.weight", (shape.hidden, q_rows)),
            (f"blk.{i}.ffn_norm.weight", (shape.hidden,)),
            (f"blk.{i}.ffn_gate.weight", (shape.intermediate, shape.hidden)),
            (f"blk.{i}.ffn_up.weight", (shape.intermediate, shape.hidden)),
            (f"blk.{i}.ffn_down.weight", (shape.hidden, shape.intermediate)),
        ]
    tensors.append(("output_norm.weight", (shape.hidden,)))
    if not shape.tied_embeddings:
        tensors.append(("output.weight", (shape.vocab, shape.hidden)))
    return tensors


def random_tensor(rng: np.random.Generator, name: str, rows_shape: tuple[int, ...]) -> np.ndarray:
    """Norm weights are ones (float32, as llama.cpp keeps them); matrices float16 normals."""
    if len(rows_shape) == 1:
        return np.ones(rows_shape, dtype=np.float32)
    out = np.empty(rows_shape, dtype=np.float16)
    chunk = max(1, (1 << 24) // rows_shape[1])  # rows at a time: a few MB of float32 transient
    for start in range(0, rows_shape[0], chunk):
        out[start:start + chunk] = rng.standard_normal((min(chunk, rows_shape[0] - start), rows_shape[1]),
                                                       dtype=np.float32) * WEIGHT_STD
    return out


def add_tokenizer(writer: GGUFWriter, vocab: int) -> None:
    """The default model's GGUF tokenizer (BPE, merges, specials, chat template), its token
    list padded with unreachable normal tokens up to `vocab`."""
    metadata = read_metadata(GGUFReader(extract_gguf("smollm2-135m-instruct", progress=False)))
    tokens = list(metadata["tokenizer.ggml.tokens"])
    types = [int(t) for t in metadata["tokenizer.ggml.token_type"]]
    if len(tokens) > vocab:
        raise ValueError(f"the default tokenizer has {len(tokens)} tokens, more than the shape's vocab {vocab}")
    tokens += [f"<|random_pad_{i}|>" for i in range(vocab - len(tokens))]
    types += [int(TokenType.NORMAL)] * (vocab - len(types))
    writer.add_tokenizer_model(metadata["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in metadata:
        writer.add_tokenizer_pre(metadata["tokenizer.ggml.pre"])
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(metadata["tokenizer.ggml.merges"]))
    for key, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                     ("unknown", writer.add_unk_token_id), ("padding", writer.add_pad_token_id)):
        if f"tokenizer.ggml.{key}_token_id" in metadata:
            add(int(metadata[f"tokenizer.ggml.{key}_token_id"]))
    if "tokenizer.ggml.add_bos_token" in metadata:
        writer.add_add_bos_token(bool(metadata["tokenizer.ggml.add_bos_token"]))
    if "tokenizer.chat_template" in metadata:
        writer.add_chat_template(metadata["tokenizer.chat_template"])


def write_f16_gguf(shape_name: str, path: Path) -> None:
    """The random model as an F16 GGUF (norms F32), written tensor by tensor."""
    shape = SHAPES[shape_name]
    partial = path.with_name(path.name + f".partial-{os.getpid()}")
    writer = GGUFWriter(partial, "llama")
    writer.add_name(f"random {shape_name}")
    writer.add_file_type(1)  # MOSTLY_F16
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_vocab_size(shape.vocab)
    add_tokenizer(writer, shape.vocab)
    tensors = tensor_shapes(shape)
    for name, rows_shape in tensors:
        dtype = np.float32 if len(rows_shape) == 1 else np.float16
        writer.add_tensor_info(name, rows_shape, np.dtype(dtype), int(np.prod(rows_shape)) * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(SEED)
    for name, rows_shape in tensors:
        writer.write_tensor_data(random_tensor(rng, name, rows_shape))
    writer.close()
    os.replace(partial, path)


def quantize(f16_path: Path, out_path: Path, type_name: str) -> None:
    binary = llama_quantize_path()
    if not os.access(binary, os.X_OK):
        raise SystemExit(f"llama-quantize not found at {binary} (run `make llama-tools`, "
                         "or set RADIXSERVE_LLAMA_CPP_DIR)")
    partial = out_path.with_name(out_path.name + f".partial-{os.getpid()}")
    result = subprocess.run([str(binary), str(f16_path), str(partial), type_name, str(os.cpu_count() or 1)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise SystemExit(f"llama-quantize {type_name} failed (status {result.returncode}):\n{result.stdout[-2000:]}")
    os.replace(partial, out_path)


def random_gguf(shape_name: str, type_name: str, out_dir: Path | None = None) -> Path:
    """The path of the random `shape_name` model as `type_name` (F16, or any llama-quantize
    type), made on first use."""
    if shape_name not in SHAPES:
        raise ValueError(f"unknown shape {shape_name!r} (known: {', '.join(SHAPES)})")
    out_dir = out_dir or bench_models_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    f16_path = out_dir / f"{shape_name}-random-F16.gguf"
    if not f16_path.is_file():
        print(f"writing {f16_path}", file=sys.stderr)
        write_f16_gguf(shape_name, f16_path)
    if type_name.upper() == "F16":
        return f16_path
    path = out_dir / f"{shape_name}-random-{type_name}.gguf"
    if not path.is_file():
        print(f"quantizing {path.name} with llama-quantize", file=sys.stderr)
        quantize(f16_path, path, type_name)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="llama-3.2-1b", choices=sorted(SHAPES))
    parser.add_argument("--types", default="Q4_K_M,Q8_0",
                        help="comma-separated: F16 or llama-quantize's type names (Q4_K_M, Q8_0, Q6_K, ...)")
    parser.add_argument("--out-dir", type=Path, default=None, help="default: $RADIXSERVE_HOME/bench-models")
    args = parser.parse_args(argv)
    for type_name in filter(None, (t.strip() for t in args.types.split(","))):
        print(random_gguf(args.shape, type_name, args.out_dir))


if __name__ == "__main__":
    main()
