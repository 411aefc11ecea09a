"""Engine settings, validated once."""

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.document_reuse_config import DocumentReuseConfig
from engine.kv_disk_config import KVDiskConfig
from engine.kv_dtype_config import KVDtypeConfig
from engine.setting import SIZE_UNITS
from engine.speculation_config import SpeculationConfig
from kernels.cpu_features import PREFILL_DTYPE_CHOICES
from model.backends import PREFILL_ATTENTION_CHOICES

# The KV pool when not told its size: this many full contexts (room for that many requests at full length, or
# many short ones beside their cached prefixes; pages beyond it live on in the disk tier), as llama.cpp sizes by
# context, never more than MAX_DEFAULT_KV_CACHE_FRACTION of free memory (docs/performance.md: RSS at rest)
DEFAULT_KV_CACHE_CONTEXTS = 4
MAX_DEFAULT_KV_CACHE_FRACTION = 0.25

def parse_kv_cache_memory(text: str) -> tuple[int | None, float | None]:
    """'2GiB', '500MB', '1073741824' -> (bytes, None); '0.3' -> (None, fraction of free memory)."""
    value = text.strip().lower()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    if not match or match.group(2) not in SIZE_UNITS:
        raise ValueError(f"--kv-cache-memory: expected bytes like '2GiB' or a fraction like '0.3', got {text!r}")
    number = float(match.group(1))
    if match.group(2) == "" and number < 1:
        if number <= 0:
            raise ValueError(f"--kv-cache-memory fraction must be in (0, 1), got {text!r}")
        return None, number
    return int(number * SIZE_UNITS[match.group(2)]), None


def available_memory_bytes(device: torch.device) -> int:
    """Memory the KV pool may take a fraction of: free GPU memory, or MemAvailable."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def kv_pool_bytes(config: "EngineConfig", bytes_per_token: int, max_model_len: int,
                  device: torch.device) -> tuple[int, str]:
    """The KV pool's size in bytes, and how it was chosen (for the startup log)."""
    if config.kv_cache_bytes is not None:
        return config.kv_cache_bytes, "--kv-cache-memory"
    available = available_memory_bytes(device)
    if config.kv_cache_fraction is not None:
        return int(config.kv_cache_fraction * available), f"--kv-cache-memory {config.kv_cache_fraction:g} of free memory"
    by_context = DEFAULT_KV_CACHE_CONTEXTS * max_model_len * bytes_per_token
    cap = int(MAX_DEFAULT_KV_CACHE_FRACTION * available)
    if by_context <= cap:
        return by_context, f"default: {DEFAULT_KV_CACHE_CONTEXTS} contexts of {max_model_len} tokens"
    return cap, (f"default: {DEFAULT_KV_CACHE_CONTEXTS} contexts of {max_model_len} tokens would be more than "
                 f"{MAX_DEFAULT_KV_CACHE_FRACTION:g} of free memory")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    if name != "cpu" and not name.startswith("cuda"):
        raise ValueError(f"--device must be auto, cpu or cuda, got {name!r}")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if name not in dtypes:
        raise ValueError(f"--dtype must be auto, float32 or bfloat16, got {name!r}")
    return dtypes[name]


EVICTION_POLICIES = ("lru", "lfu")


@dataclass(frozen=True)
class EngineConfig:
    model_dir: Path
    device: str = "auto"
    dtype: str = "auto"
    page_size: int = 16
    kv_cache_bytes: int | None = None  # exact pool size in bytes; else a fraction:
    kv_cache_fraction: float | None = None  # of available memory at start-up; neither: kv_pool_bytes' default
    max_num_batched_tokens: int | None = None  # the per-step token budget (decodes + prefill chunks);
    # None: the backend's (model/backends: 512 on CPU, 2048 on CUDA)
    max_num_seqs: int = 64  # requests admitted (prefilling or running) at once
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    schedule: str = "fcfs"  # or "lpm": longest cached prefix first
    eviction_policy: str = "lru"  # or "lfu": fewest prefix hits first (cache/eviction.py)
    enable_prefix_cache: bool = True
    gguf_blocks: bool = True  # decode reads the GGUF blocks a converted model keeps (CPU, float32)
    backend: str = "auto"  # what executes the model: auto, torch or cpu (model/backends)
    # cpu: few-rows kernel limits from the measured table, or "measure" (timed per weight shape at load;
    # not the default: it misjudged a 1-row product and slowed decode, docs/performance.md)
    few_rows_crossover: str = "fixed"
    # cpu: the C kernel variant (kernels.cpu_features.VARIANT_CHOICES; "auto": the best this CPU runs)
    cpu_kernels: str = "auto"
    # cpu: products over the GGUF blocks with int8 activations (kernels/cpu_gemm_q8.py), prefill and decode;
    # else float32 activations (oneDNN, the float blocks kernel). Off by default until its quality against
    # float32 is measured (bench/int8_activation_quality.py; docs/performance.md)
    int8_activations: bool = False
    # cpu: what the few-rows (decode) kernels over GGUF blocks multiply with: "int16" (activations quantized
    # per group of 32, integer dot products; ~1.6x faster decode; the default: top-1 agreement with
    # float32 0.9998 on 200 prompts, teacher-forced, docs/performance.md) or "float32" (each weight decoded to its float32
    # value; exact up to summation order)
    decode_activations: str = "int16"
    # cpu: a model whose projections fit in this many bytes in prefill's dtype keeps a copy of them for
    # prefill beside its blocks (model/backends/cpu_backend.py); 0: prefill over the blocks always; None (the
    # default): FLOAT_PREFILL_MAX_BYTES, but 0 where prefill runs bf16 products (their tiles are nearly as fast) or
    # the FMA GEMM over blocks (the avx2 kernels: as fast as the copy)
    float_prefill_max_bytes: int | None = None
    # cpu: what prefill's GEMMs over GGUF blocks multiply in (kernels.cpu_features.PREFILL_DTYPE_CHOICES):
    # "auto" (the default: bfloat16 products where oneDNN runs them, AMX, and they measured >= 1.25x float32's
    # GEMM; else float32), "bfloat16" (x and weights rounded to bf16; needs native bf16: AVX512_BF16 or AMX;
    # bf16 tensors where bf16 products do not run) or "float32". bf16 products passed the quality bar (top-1
    # agreement with float32 0.9942 on 200 prompts) and, with prompt rows always on the prefill path, give a
    # prompt's rows the same bits however it was chunked, batched or cached (docs/performance.md, "bfloat16
    # products")
    prefill_dtype: str = "auto"
    # cpu: prefill attention on the C kernel over pages where it runs ("auto": on AMX in bf16 where the model's
    # projections prefill over blocks in bf16 products; top-1 agreement with float32 in docs/performance.md,
    # "Prefill attention on AMX tiles in bf16"), its float32 builds ("float32"), or torch's SDPA over gathered
    # K/V ("sdpa") (the last two: the comparisons bench/prefill_attention_bench.py makes)
    # (model.backends.PREFILL_ATTENTION_CHOICES)
    prefill_attention: str = "auto"
    # Each feature's settings, in its own file (flags derived from their fields: server/config_flags.py)
    kv_disk: KVDiskConfig = KVDiskConfig()  # the disk tier of KV pages (engine/kv_disk_config.py)
    documents: DocumentReuseConfig = DocumentReuseConfig()  # document KV reuse (engine/document_reuse_config.py)
    # Draft-model-free speculative decoding (engine/speculation_config.py; engine/draft_proposer.py runs it)
    speculation: SpeculationConfig = SpeculationConfig()
    # The KV cache's stored formats, K and V (engine/kv_dtype_config.py; kernels/kv_format.py)
    kv_dtype: KVDtypeConfig = KVDtypeConfig()

    def __post_init__(self):
        if self.page_size <= 0 or self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size must be a power of two, got {self.page_size}")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes <= 0:
            raise ValueError(f"kv_cache_bytes must be positive, got {self.kv_cache_bytes}")
        if self.kv_cache_fraction is not None and not 0 < self.kv_cache_fraction < 1:
            raise ValueError(f"kv_cache_fraction must be in (0, 1), got {self.kv_cache_fraction}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.eviction_policy not in EVICTION_POLICIES:
            raise ValueError(f"eviction_policy must be one of {', '.join(EVICTION_POLICIES)}, "
                             f"got {self.eviction_policy!r}")
        if self.schedule not in ("fcfs", "lpm"):
            raise ValueError(f"schedule must be 'fcfs' or 'lpm', got {self.schedule!r}")
        if self.prefill_attention not in PREFILL_ATTENTION_CHOICES:
            raise ValueError(f"prefill_attention must be one of {', '.join(PREFILL_ATTENTION_CHOICES)}, "
                             f"got {self.prefill_attention!r}")
        if self.prefill_dtype not in PREFILL_DTYPE_CHOICES:
            raise ValueError(f"prefill_dtype must be one of {', '.join(PREFILL_DTYPE_CHOICES)}, "
                             f"got {self.prefill_dtype!r}")
