"""The cpu backend's speed against the machine's limits, int8 and float32 activations side by side.

    nice .venv/bin/python -m bench.cpu_speed_bench [--model smollm2-135m-instruct] [--threads N]
        [--lengths 1024,4096] [--llama-server PATH]

One run, one process, every timing alternating between the variants (the median of 3):
- the machine's limits on one weight shape (2048 x 2048, 512 rows): the int8 GEMM over Q8_0 blocks
  (kernels/cpu_gemm_q8.py), torch's fbgemm dynamic int8 linear, oneDNN's bfloat16 and float32 GEMMs,
  in GOP/s; and copy bandwidth (a 256 MiB tensor copied), GB/s;
- radixserve in-process (engine/llm_engine.py), int8 activations (the default) and float32 ones:
  cold prefill tokens/s at each length (prefix cache off), decode tokens/s at batch 1 and 8
  (64 tokens each, fixed); prefill's
  rate as GOP/s of the linear layers (2 x their weights a token) against the int8 GEMM's;
- with --llama-server (a built binary; none is built here), llama-server on the model's GGUF file,
  the same prompts over HTTP, its own timings (prompt_per_second, predicted_per_second).
Prints the CPU's instruction sets and the kernel variant: the numbers belong to them.
"""

import argparse
import json
import random
import statistics
import sys
import time
import urllib.request
from pathlib import Path

import torch

from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from kernels import cpu_gemm_q8
from kernels.block_formats import BlockWeight
from kernels.cpu_features import this_cpu
from kernels.packed_linear import pack_weight, packed_linear
from store.model_store import pull, radixserve_home

REPEATS = 3
DECODE_TOKENS = 64
KV_CACHE_BYTES = 512 << 20


def _best_of(fn, repeats: int = 5) -> float:
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
    blocks = BlockWeight.from_gguf("Q8_0", quantize(weight.numpy(), GGMLQuantizationType.Q8_0), cols)
    packed = kernels.repack(blocks)
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
    best = {name: float("inf") for name in paths}
    for _ in range(REPEATS):  # interleaved: noise hits every path alike
        for name, fn in paths.items():
            best[name] = min(best[name], _best_of(fn, 2))
    limits = {name: ops / seconds / 1e9 for name, seconds in best.items()}
    source = torch.empty(64 << 20, dtype=torch.float32).normal_()
    target = torch.empty_like(source)
    seconds = _best_of(lambda: target.copy_(source))
    limits["copy GB/s (read + write)"] = 2 * source.numel() * 4 / seconds / 1e9
    return limits


def _engine(model_dir: Path, int8: bool) -> LLMEngine:
    return LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", kv_cache_bytes=KV_CACHE_BYTES,
                                  enable_prefix_cache=False, max_num_batched_tokens=4096, int8_activations=int8))


def _prefill_seconds(engine: LLMEngine, prompt: list[int]) -> float:
    started = time.perf_counter()
    engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    return time.perf_counter() - started


def _decode_rate(engine: LLMEngine, prompts: list[list[int]]) -> float:
    """Tokens/s of DECODE_TOKENS tokens each for len(prompts) sequences together, prefill excluded."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    prefill = time.perf_counter()
    engine.generate(prompts, params)
    prefill = time.perf_counter() - prefill
    params = SamplingParams(max_tokens=DECODE_TOKENS + 1, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    engine.generate(prompts, params)
    return len(prompts) * DECODE_TOKENS / (time.perf_counter() - started - prefill)


def linear_weight_elements(engine: LLMEngine) -> int:
    """Weights of the linear layers a prefill token multiplies (lm_head once per sequence: left out)."""
    config = engine.model.config
    per_layer = config.hidden_size * (config.num_heads + 2 * config.num_kv_heads) * config.head_dim \
        + config.num_heads * config.head_dim * config.hidden_size + 3 * config.hidden_size * config.intermediate_size
    return per_layer * config.num_layers


def radixserve_rates(model_dir: Path, lengths: list[int]) -> dict[str, dict[str, float]]:
    engines = {"int8 activations": _engine(model_dir, True), "float32 activations": _engine(model_dir, False)}
    for name, engine in engines.items():
        print(f"  {name}: {engine.backend.describe()}", flush=True)
    rng = random.Random(0)
    vocab = engines["int8 activations"].vocab_size

    def prompt(length: int) -> list[int]:
        return [rng.randrange(100, vocab) for _ in range(length)]

    results: dict[str, dict[str, float]] = {name: {} for name in engines}
    for engine in engines.values():
        _prefill_seconds(engine, prompt(64))  # warm-up
    for length in lengths:
        samples = {name: [] for name in engines}
        for _ in range(REPEATS):
            for name, engine in engines.items():
                samples[name].append(_prefill_seconds(engine, prompt(length)))
        for name in engines:
            results[name][f"prefill tok/s @{length}"] = length / statistics.median(samples[name])
    for batch in (1, 8):
        samples = {name: [] for name in engines}
        for _ in range(REPEATS):
            for name, engine in engines.items():
                samples[name].append(_decode_rate(engine, [prompt(32) for _ in range(batch)]))
        for name in engines:
            results[name][f"decode tok/s @batch {batch}"] = statistics.median(samples[name])
    linear_ops = 2 * linear_weight_elements(engines["int8 activations"])
    for name in engines:
        best_prefill = max(v for k, v in results[name].items() if k.startswith("prefill"))
        results[name]["linear GOP/s at the best prefill"] = best_prefill * linear_ops / 1e9
    return results


def llama_server_rates(binary: Path, gguf_path: Path, lengths: list[int], vocab: int) -> dict[str, float]:
    from bench.llama_server import llama_server

    rng = random.Random(1)
    results = {}
    # 8 slots of 4352 tokens: a 4096-token prompt and its answer fit one
    with llama_server(binary, gguf_path, num_slots=8, model_name="bench",
                      extra_args=("--ctx-size", str(8 * 4352), "--threads", str(torch.get_num_threads()))) as url:
        def complete(tokens: list[int], n_predict: int) -> dict:
            body = json.dumps({"prompt": tokens, "n_predict": n_predict, "cache_prompt": False,
                               "ignore_eos": True, "temperature": 0}).encode()
            request = urllib.request.Request(f"{url}/completion", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=600) as response:
                return json.loads(response.read())["timings"]

        for length in lengths:
            rates = [complete([rng.randrange(100, vocab) for _ in range(length)], 1)["prompt_per_second"]
                     for _ in range(REPEATS)]
            results[f"prefill tok/s @{length}"] = statistics.median(rates)
        results["decode tok/s @batch 1"] = statistics.median(
            complete([rng.randrange(100, vocab) for _ in range(32)], DECODE_TOKENS)["predicted_per_second"]
            for _ in range(REPEATS))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--lengths", default="1024,4096")
    parser.add_argument("--llama-server", type=Path, help="a built llama-server binary (run on the same GGUF file)")
    parser.add_argument("--gguf", type=Path, help="the GGUF file the model was converted from (for llama-server)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    lengths = [int(v) for v in args.lengths.split(",")]
    print(f"cpu: {this_cpu().describe()}; kernels: {this_cpu().best_variant()}; {args.threads} threads")
    print("machine limits (one weight shape, 2048 x 2048 x 512 rows):")
    limits = machine_limits()
    for name, value in limits.items():
        print(f"  {name}: {value:.1f}" + ("" if "GB/s" in name else " GOP/s"))
    model_dir = pull(args.model)
    print(f"radixserve on {model_dir.name}:")
    results = radixserve_rates(model_dir, lengths)
    if args.llama_server:
        results["llama-server"] = llama_server_rates(args.llama_server, args.gguf, lengths, 49152)
    metrics = sorted({metric for values in results.values() for metric in values},
                     key=lambda m: (not m.startswith("prefill"), m))
    print(f"  {'':40s}" + "".join(f"{name:>24s}" for name in results))
    for metric in metrics:
        print(f"  {metric:40s}" + "".join(f"{values.get(metric, float('nan')):24.1f}" for values in results.values()))
    int8_limit = next(value for name, value in limits.items() if name.startswith("int8 GEMM"))
    best = results["int8 activations"]["linear GOP/s at the best prefill"]
    print(f"  int8 prefill's linear layers at {100 * best / int8_limit:.0f}% of the int8 GEMM's rate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
