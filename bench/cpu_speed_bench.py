"""Prefill and decode speed of radixserve against llama-server on the same GGUF files, and both
against the machine's limits, side by side in one run.

    nice .venv/bin/python -m bench.cpu_speed_bench [--models default,q4_k_m,q8_0] [--lengths 1024,4096]
        [--paths default,float32,bf16,int8] [--no-decode] [--prefill-repeats 1] [--decode-repeats 3] [--threads N]

First the machine's limits on one weight shape (2048 x 2048, 512 rows): our int8 GEMM over Q8_0 blocks
(kernels/cpu_gemm_q8.py), torch's fbgemm dynamic int8 linear, oneDNN's bfloat16 and float32 GEMMs and, where they run, bf16
products in a float32 GEMM and our AMX GEMM over Q8_0 blocks (what bf16 prefill runs:
kernels/bf16_products.py, kernels/amx_gemm.py) (GOP/s, interleaved, best of 3), and copy bandwidth (GB/s, read + write). Then, per model, each server started
alone on the model's GGUF file: llama-server (bench/llama_server.py, prompt caching off per request) and
radixserve once per prefill path (`--paths`: `serve --model FILE` with its defaults, `--prefill-dtype float32`,
`--prefill-dtype bfloat16` (where the CPU has native bf16; elsewhere the row says why it is missing), or
`--int8-activations`; prefix cache and KV disk tier off), the same client over HTTP (/v1/completions,
token-id prompts of random ids, greedy, ignore_eos):
- prefill tokens/s, cold: a prompt of L random tokens, one output token, wall time of the request
  (the median of `--prefill-repeats`, after a 64-token warm-up);
- decode tokens/s at batch 1 and 8 (unless `--no-decode`): B streamed requests at once, 32-token prompts,
  DECODE_TOKENS + 1 tokens each; B x DECODE_TOKENS over the time from the last stream's first chunk to the
  last chunk; the median of `--decode-repeats` such rounds (one round of 64 tokens varied by 1.4x from run
  to run; the first round also holds radixserve's recording of a decode step of that size);
- the server's peak RSS (VmHWM of /proc/PID/status, read before it is stopped).
Then per model: prefill's linear layers as GOP/s (2 x their weights a token; the LM head runs for
the last token only, attention not counted) against the fastest GEMM measured (the machine's limit), the same
with attention's products counted too (the model's ops: Q K^T and P V over a causal prompt, `attention_ops`), batch-1
decode against the bandwidth limit (the file's bytes read once a token at the copy bandwidth), and each
radixserve row's prefill over llama-server's at each length.
Models: `default` (SmolLM2-135M-Instruct Q4_1, the pulled default) and the random files in
Llama-3.2-1B's shapes (bench/random_gguf.py: made once by llama-quantize). Prints the CPU's
instruction sets: the numbers belong to them. Results go to docs/performance.md by hand. Run times on a
quiet 2-core machine: docs/performance.md ("The side-by-side bench").
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import torch

from bench.llama_server import find_or_build_llama_server, llama_server_version
from bench.local_server import stop_process
from bench.quant_memory_bench import peak_rss_bytes, start
from bench.random_gguf import random_gguf
from kernels import amx_gemm, bf16_products, cpu_gemm_q8
from kernels.block_formats import BlockWeight
from kernels.cpu_features import this_cpu
from kernels.native_build import NativeUnavailable
from kernels.packed_linear import pack_weight, packed_linear
from store.gguf_import import read_metadata
from store.model_store import radixserve_home

DECODE_TOKENS = 64
DECODE_PROMPT_TOKENS = 32
# radixserve's prefill paths (a row each) -> the serve flags that choose it
PREFILL_PATHS = {"default": [],  # serve as a new user starts it (prefill dtype auto)
                 "float32": ["--prefill-dtype", "float32", "--no-int8-activations"],
                 "bf16": ["--prefill-dtype", "bfloat16", "--no-int8-activations"],
                 "int8": ["--int8-activations"]}
CONTEXT = 4352  # tokens a llama-server slot holds: a 4096-token prompt and its answer
NUM_SLOTS = 8  # decode at batch 8
MODEL_FILES = {"default": None, "q4_k_m": ("llama-3.2-1b", "Q4_K_M"), "q8_0": ("llama-3.2-1b", "Q8_0")}


def _best_of(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def machine_limits() -> dict[str, float]:
    """GOP/s of each GEMM path on 512 x 2048 @ (2048 x 2048)^T, and copy GB/s."""
    rows, cols, m = 2048, 2048, 512
    ops = 2 * rows * cols * m
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(rows, cols, generator=generator) * 0.02
    x = torch.randn(m, cols, generator=generator)
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    kernels = cpu_gemm_q8.load(radixserve_home() / "kernels", variant=this_cpu().best_variant())
    packed = kernels.repack(BlockWeight.from_gguf("Q8_0", quantize(weight.numpy(), GGMLQuantizationType.Q8_0), cols))
    linear = torch.nn.Linear(cols, rows, bias=False)
    linear.weight.data.copy_(weight)
    dynamic = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear},
                                                     dtype=torch.qint8)
    packed_f32 = pack_weight(weight)
    x_bf16, w_bf16 = x.bfloat16(), weight.bfloat16()
    paths = {
        f"int8 GEMM over Q8_0 blocks ({kernels.variant})": lambda: kernels(x, packed),
        "fbgemm dynamic int8 linear": lambda: dynamic(x),
        "oneDNN bfloat16 GEMM": lambda: torch.nn.functional.linear(x_bf16, w_bf16),
        "oneDNN float32 GEMM (prepacked)": lambda: packed_linear(x, packed_f32, None),
    }
    if bf16_products.run_here():  # what bf16 prefill runs where it does (kernels/bf16_products.py)
        paths["oneDNN bf16 products in a float32 GEMM (prepacked)"] = lambda: _in_bf16_products(
            packed_linear, x, packed_f32, None)
        try:  # and, over blocks, on our AMX kernel (kernels/amx_gemm.py): x packed in every call, as in prefill
            amx = amx_gemm.load(radixserve_home() / "kernels")
            q8_0 = BlockWeight.from_gguf("Q8_0", quantize(weight.numpy(), GGMLQuantizationType.Q8_0), cols)
            paths["AMX bf16 GEMM over Q8_0 blocks"] = lambda: amx.matmul(amx.pack(x), q8_0)
        except NativeUnavailable as error:
            print(f"AMX GEMM over blocks not measured: {error}", flush=True)
    best = {name: float("inf") for name in paths}
    for _ in range(3):  # interleaved: noise hits every path alike
        for name, fn in paths.items():
            best[name] = min(best[name], _best_of(fn, 2))
    limits = {name: ops / seconds / 1e9 for name, seconds in best.items()}
    source = torch.empty(64 << 20, dtype=torch.float32).normal_()
    target = torch.empty_like(source)
    limits["copy GB/s (read + write)"] = 2 * source.numel() * 4 / _best_of(lambda: target.copy_(source), 5) / 1e9
    return limits


def _in_bf16_products(fn, *args):
    with bf16_products.bf16_products():
        return fn(*args)


def model_file(name: str) -> Path:
    """The GGUF file a model name stands for (the default model's as pulled)."""
    if MODEL_FILES[name] is None:
        files = sorted((radixserve_home() / "downloads").rglob("*.gguf"))
        matches = [f for f in files if "smollm2-135m" in f.name.lower() and "q4_1" in f.name.lower()]
        if not matches:
            raise SystemExit(f"no SmolLM2-135M Q4_1 GGUF under {radixserve_home() / 'downloads'}: "
                             "run `radixserve pull` first")
        return matches[0]
    shape, type_name = MODEL_FILES[name]
    return random_gguf(shape, type_name)


def gguf_metadata(gguf_path: Path) -> dict:
    from gguf import GGUFReader

    return read_metadata(GGUFReader(gguf_path))


def llama_kv_bytes(meta: dict) -> int:
    """llama-server's KV cache here: f16 K and V of every layer for NUM_SLOTS * CONTEXT tokens. radixserve's
    pool gets the same bytes (float32: half the tokens, enough for a 4k prompt and 8 short streams)."""
    arch = meta["general.architecture"]
    heads, kv_heads = meta[f"{arch}.attention.head_count"], meta[f"{arch}.attention.head_count_kv"]
    head_dim = meta.get(f"{arch}.attention.key_length", meta[f"{arch}.embedding_length"] // heads)
    return 2 * meta[f"{arch}.block_count"] * NUM_SLOTS * CONTEXT * kv_heads * head_dim * 2


def linear_weight_elements(meta: dict) -> int:
    """Weights a prefill token multiplies in the linear layers (the LM head, once a sequence, left out)."""
    arch = meta["general.architecture"]
    hidden, ffn, layers = (meta[f"{arch}.embedding_length"], meta[f"{arch}.feed_forward_length"],
                           meta[f"{arch}.block_count"])
    heads, kv_heads = meta[f"{arch}.attention.head_count"], meta[f"{arch}.attention.head_count_kv"]
    head_dim = hidden // heads
    per_layer = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden + 3 * hidden * ffn
    return per_layer * layers


def attention_ops(meta: dict, length: int) -> float:
    """Multiply-add ops (x 2) a prefill token of a causal prompt of `length` tokens spends in attention, on
    average: Q K^T and P V over the (length + 1) / 2 keys before it, every query head, every layer."""
    arch = meta["general.architecture"]
    hidden, heads, layers = (meta[f"{arch}.embedding_length"], meta[f"{arch}.attention.head_count"],
                             meta[f"{arch}.block_count"])
    head_dim = meta.get(f"{arch}.attention.key_length", hidden // heads)
    return 2 * 2 * layers * heads * head_dim * (length + 1) / 2


class Client:
    def __init__(self, port: int, vocab: int, seed: int):
        self.url = f"http://127.0.0.1:{port}/v1/completions"
        self.model = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).json()["data"][0]["id"]
        self.vocab, self.rng = vocab, random.Random(seed)

    def prompt(self, length: int) -> list[int]:
        return [self.rng.randrange(100, self.vocab - 100) for _ in range(length)]

    def body(self, prompt: list[int], max_tokens: int, stream: bool) -> dict:
        return {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": stream, "cache_prompt": False}

    def prefill_seconds(self, length: int) -> float:
        started = time.perf_counter()
        response = httpx.post(self.url, json=self.body(self.prompt(length), 1, False), timeout=1800)
        response.raise_for_status()
        return time.perf_counter() - started

    def _stream_times(self, prompt: list[int], times: list) -> None:
        with httpx.stream("POST", self.url, json=self.body(prompt, DECODE_TOKENS + 1, True), timeout=1800) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    if any(c.get("text") is not None for c in json.loads(line[6:]).get("choices", [])):
                        times.append(time.perf_counter())

    def decode_rate(self, batch: int) -> float:
        """Tokens/s after the first token of each of `batch` concurrent streams."""
        prompts = [self.prompt(DECODE_PROMPT_TOKENS) for _ in range(batch)]
        times = [[] for _ in range(batch)]
        threads = [threading.Thread(target=self._stream_times, args=(p, t)) for p, t in zip(prompts, times)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if any(len(t) < 2 for t in times):
            raise RuntimeError(f"streams returned {[len(t) for t in times]} chunks")
        # ignore_eos: each stream made DECODE_TOKENS + 1 tokens, whatever chunks carried them (a token may
        # end mid-character and send no text; a last chunk may carry only the finish reason)
        return batch * DECODE_TOKENS / (max(t[-1] for t in times) - max(t[0] for t in times))


def measure_server(name: str, argv: list[str], port: int, vocab: int, lengths: list[int], log_path: Path,
                   prefill_repeats: int, decode: bool, decode_repeats: int = 3) -> dict:
    process = start(argv, port, log_path)
    try:
        client = Client(port, vocab, seed=len(lengths))  # every server gets the same prompts
        client.prefill_seconds(64)  # warm-up
        results = {}
        for length in lengths:
            seconds = [client.prefill_seconds(length) for _ in range(prefill_repeats)]
            results[f"prefill tok/s @{length}"] = length / statistics.median(seconds)
        for batch in (1, NUM_SLOTS) if decode else ():
            results[f"decode tok/s @batch {batch}"] = statistics.median(client.decode_rate(batch)
                                                                        for _ in range(decode_repeats))
        results["peak RSS GiB"] = peak_rss_bytes(process.pid) / 2**30
    finally:
        stop_process(process)
    print(f"    {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in results.items()), flush=True)
    return results


def radixserve_argv(gguf_path: Path, port: int, kv_bytes: int, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "server.cli", "serve", "--model", str(gguf_path), "--host", "127.0.0.1",
            "--port", str(port), "--dtype", "float32", "--kv-cache-memory", str(kv_bytes), "--no-prefix-cache",
            "--no-kv-disk", "--speculative", "off", "--max-num-batched-tokens", "4096", *extra]


def llama_argv(binary: Path, gguf_path: Path, port: int, threads: int) -> list[str]:
    return [str(binary), "-m", str(gguf_path), "--host", "127.0.0.1", "--port", str(port), "--parallel",
            str(NUM_SLOTS), "--ctx-size", str(NUM_SLOTS * CONTEXT), "--threads", str(threads), "--no-webui"]


def radixserve_rows(paths: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """(row name -> the serve flags of each path that runs here, a line for each path that does not)."""
    from kernels.cpu_features import resolve_prefill_dtype
    from kernels.packed_linear import bf16_is_available

    rows, missing = {}, []
    for path in paths:
        if path not in PREFILL_PATHS:
            raise SystemExit(f"--paths takes {', '.join(PREFILL_PATHS)}, got {path!r}")
        if path == "bf16":
            try:
                resolve_prefill_dtype("bfloat16", this_cpu(), bf16_is_available())
            except ValueError as error:
                missing.append(f"radixserve bf16: not run ({error})")
                continue
        rows[f"radixserve {path}"] = PREFILL_PATHS[path]
    return rows, missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODEL_FILES), help=f"of {', '.join(MODEL_FILES)}")
    parser.add_argument("--lengths", default="1024,4096")
    parser.add_argument("--paths", default=",".join(PREFILL_PATHS), help="radixserve's prefill paths, a row each")
    parser.add_argument("--prefill-repeats", type=int, default=1, help="prefill requests per length (the median)")
    parser.add_argument("--decode-repeats", type=int, default=3, help="decode rounds per batch size (the median)")
    parser.add_argument("--no-decode", action="store_true", help="prefill and peak RSS only")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--log-dir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    lengths = [int(v) for v in args.lengths.split(",")]
    ours, missing = radixserve_rows(list(filter(None, args.paths.split(","))))
    binary = find_or_build_llama_server()
    print(f"cpu: {this_cpu().describe()}; best kernels {this_cpu().best_variant()}; {args.threads} threads; "
          f"load average {os.getloadavg()[0]:.1f}; llama-server {llama_server_version(binary)}")
    for line in missing:
        print(line)
    limits = machine_limits()
    print("machine limits (2048 x 2048 weight, 512 rows):")
    for name, value in limits.items():
        print(f"  {name}: {value:.1f}" + ("" if "GB/s" in name else " GOP/s"))
    # the machine's limit for prefill: its fastest GEMM measured (int8 or bf16; AMX makes bf16 the fastest)
    best_gemm, best_rate = max(((k, v) for k, v in limits.items() if "GB/s" not in k), key=lambda item: item[1])
    print(f"the machine's GEMM limit: {best_gemm}, {best_rate:.1f} GOP/s")
    copy_rate = limits["copy GB/s (read + write)"]
    tables = {}
    for model in filter(None, args.models.split(",")):
        gguf_path = model_file(model)
        meta = gguf_metadata(gguf_path)
        vocab = len(meta["tokenizer.ggml.tokens"])
        print(f"{model}: {gguf_path.name} ({gguf_path.stat().st_size / 2**30:.2f} GiB)", flush=True)
        rows = {}
        for server in ["llama-server", *ours]:
            port = random.randrange(18000, 19000)
            log_path = args.log_dir / f"cpu_speed_bench_{model}_{server.replace(' ', '_')}.log"
            command = (llama_argv(binary, gguf_path, port, args.threads) if server == "llama-server" else
                       radixserve_argv(gguf_path, port, llama_kv_bytes(meta), ours[server]))
            rows[server] = measure_server(server, command, port, vocab, lengths, log_path, args.prefill_repeats,
                                          not args.no_decode, args.decode_repeats)
        linear_ops = 2 * linear_weight_elements(meta)
        for values in rows.values():
            best_prefill = max(v for k, v in values.items() if k.startswith("prefill"))
            values["prefill linear GOP/s"] = best_prefill * linear_ops / 1e9
            values["% of best GEMM rate"] = 100 * values["prefill linear GOP/s"] / best_rate
            # the model's ops, attention's included, at the length where they ran fastest
            values["prefill model GOP/s"] = max(values[f"prefill tok/s @{length}"]
                                                * (linear_ops + attention_ops(meta, length)) / 1e9
                                                for length in lengths)
            values["% of best GEMM rate, attention counted"] = 100 * values["prefill model GOP/s"] / best_rate
            if not args.no_decode:
                values["% of bandwidth limit @batch 1"] = (100 * values["decode tok/s @batch 1"]
                                                           * gguf_path.stat().st_size / (copy_rate * 1e9))
        for values in rows.values():  # prefill over llama-server's, per length
            for length in lengths:
                values[f"prefill @{length} / llama-server"] = (values[f"prefill tok/s @{length}"]
                                                              / rows["llama-server"][f"prefill tok/s @{length}"])
        tables[model] = rows
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}; {time.perf_counter() - started:.0f} s")
    for model, rows in tables.items():
        print(f"\n{model} ({model_file(model).name})\n")
        metrics = list(rows["llama-server"])
        print("| | " + " | ".join(metrics) + " |")
        print("|---|" + "---|" * len(metrics))
        for server, values in rows.items():
            print(f"| {server} | " + " | ".join(f"{values[metric]:.2f}" for metric in metrics) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
