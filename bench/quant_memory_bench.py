"""Memory and batch-1 decode speed of radixserve against llama-server on the same quantized GGUF,
side by side in one run (bench/random_gguf.py's random models in real models' shapes).

    python -m bench.quant_memory_bench --shape llama-3.2-1b --types Q4_K_M,Q8_0 [--decode-activations float32,int16]
        [--cpu-kernels auto,avx2]

For each type: the file is made (once), converted for radixserve by `radixserve pull` in its own
process (conversion is not serving), then each server is started alone on it, one greedy
completion of --max-tokens tokens is streamed at batch 1 (ignore_eos, after a warm-up request),
and the server's peak resident memory (VmHWM of /proc/PID/status: everything it ever held,
mapped file pages included) is read before it is stopped. radixserve's KV pool gets exactly the
bytes of llama-server's KV cache for --context tokens (f16 K and V for every layer), so the
comparison is of everything else. Decode tokens/s: (tokens - 1) / (time of the last token - time
of the first).
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.llama_server import find_or_build_llama_server
from bench.local_server import stop_process
from bench.random_gguf import SHAPES, random_gguf

PROMPT = "Write a long story about a lighthouse keeper and the sea."
RSS_LIMIT_RATIO = 1.3  # the bound: radixserve's peak RSS <= 1.3x llama-server's


def kv_bytes(shape_name: str, context: int) -> int:
    """llama-server's KV cache for `context` tokens: f16 K and V, every layer."""
    shape = SHAPES[shape_name]
    return 2 * shape.layers * context * shape.kv_heads * shape.head_dim * 2


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def start(argv: list[str], port: int, log_path: Path, timeout_s: float = 900) -> subprocess.Popen:
    log = open(log_path, "w")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{argv[0]} exited ({process.returncode}); log: {log_path}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop_process(process)
    raise RuntimeError(f"{argv[0]} not healthy after {timeout_s} s; log: {log_path}")


def decode_tokens_per_s(port: int, max_tokens: int) -> tuple[float, int]:
    """One streamed greedy completion at batch 1 -> (tokens/s after the first token, tokens)."""
    model = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).json()["data"][0]["id"]
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    times = []
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if any(choice.get("text") for choice in chunk.get("choices", [])):
                times.append(time.perf_counter())
    if len(times) < 2:
        raise RuntimeError(f"the server streamed {len(times)} tokens")
    return (len(times) - 1) / (times[-1] - times[0]), len(times)


def measure(name: str, argv: list[str], port: int, log_path: Path, max_tokens: int) -> dict:
    process = start(argv, port, log_path)
    try:
        decode_tokens_per_s(port, 8)  # warm-up
        tokens_per_s, tokens = decode_tokens_per_s(port, max_tokens)
        rss = peak_rss_bytes(process.pid)
    finally:
        stop_process(process)
    return {"server": name, "peak_rss_gib": rss / 2**30, "decode_tokens_per_s": tokens_per_s, "tokens": tokens}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="llama-3.2-1b", choices=sorted(SHAPES))
    parser.add_argument("--types", default="Q4_K_M,Q8_0")
    parser.add_argument("--context", type=int, default=4096, help="llama-server's context; radixserve's KV the same bytes")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp"))
    parser.add_argument("--decode-activations", default="int16",
                        help="radixserve's decode activations (serve --decode-activations), comma-separated: one "
                             "radixserve row each, e.g. float32,int16")
    parser.add_argument("--cpu-kernels", default="auto",
                        help="radixserve's kernel builds (serve --cpu-kernels), comma-separated: one row each per "
                             "--decode-activations, e.g. auto,avx2 (the AVX-512 build's 512-bit rows against AVX2's)")
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.decode_activations.split(",") if v.strip()]
    kernel_builds = [v.strip() for v in args.cpu_kernels.split(",") if v.strip()]
    llama_server = find_or_build_llama_server()
    kv = kv_bytes(args.shape, args.context)
    rows = []
    for type_name in filter(None, (t.strip() for t in args.types.split(","))):
        path = random_gguf(args.shape, type_name)
        subprocess.run([str(Path(sys.executable).with_name("radixserve")), "pull", str(path)], check=True,
                       stdout=subprocess.DEVNULL)
        port = random.randrange(18000, 19000)
        radixserve = [str(Path(sys.executable).with_name("radixserve")), "serve", "--model", str(path), "--host", "127.0.0.1",
                      "--port", str(port), "--kv-cache-memory", str(kv), "--no-kv-disk",
                      "--speculative", "off"]  # plain decode, as llama-server's
        peer = [str(llama_server), "-m", str(path), "--host", "127.0.0.1", "--port", str(port), "--parallel", "1",
                "--ctx-size", str(args.context), "--threads", str(args.threads), "--no-webui"]
        servers = [("llama-server", peer)] + [
            (f"radixserve {variant}" + (f" {build}" if kernel_builds != ["auto"] else ""),
             radixserve + ["--decode-activations", variant, "--cpu-kernels", build])
            for variant in variants for build in kernel_builds]
        for name, command in servers:
            log = args.log_dir / f"quant_bench_{name.replace(' ', '_')}_{type_name}.log"
            row = measure(name, command, port, log, args.max_tokens)
            rows.append({"type": type_name, "file_gib": path.stat().st_size / 2**30, **row})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{args.shape}, KV {kv / 2**20:.0f} MiB each ({args.context} tokens of f16 in llama-server)")
    print("| type | file GiB | server | peak RSS GiB | RSS ratio (<= 1.3) | decode tok/s | decode ratio (>= 1) |")
    print("|---|---|---|---|---|---|---|")
    peer_row = None
    for row in rows:
        if row["server"] == "llama-server":
            peer_row = row
        print(f"| {row['type']} | {row['file_gib']:.2f} | {row['server']} | {row['peak_rss_gib']:.2f} "
              f"| {row['peak_rss_gib'] / peer_row['peak_rss_gib']:.2f} | {row['decode_tokens_per_s']:.1f} "
              f"| {row['decode_tokens_per_s'] / peer_row['decode_tokens_per_s']:.2f} |")

if __name__ == "__main__":
    main()
