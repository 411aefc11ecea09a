"""Sequences laid over shuffled pages, as a pool hands them out: what the attention kernels' tests build
their caches on (tests/kernels/conftest.py's decode cases, test_kv_formats.py, test_cpu_prefill_attention.py)."""

import math
import zlib
from collections.abc import Callable

import torch

from kernels.attention_inputs import slot_ids_of
from kernels.kv_format import KVPages


def seeded(*seed) -> torch.Generator:
    """A generator seeded by the repr of `seed`: each case its own stream."""
    return torch.Generator().manual_seed(zlib.crc32(repr(seed).encode()))


def lay_out(seqs, page_size: int, num_pages: int, gen: torch.Generator,
            write: Callable[[torch.Tensor, int], None]) -> tuple[list[list[int]], list[int]]:
    """seqs [(context_len, query_len)]: each gets the next ceil(context_len / page_size) of a shuffled
    page order, and write(its slots (context_len,), context_len) fills them. -> (page ids per sequence,
    the slots of every sequence's last query_len positions, in order)."""
    free = torch.randperm(num_pages, generator=gen).tolist()
    page_ids, new_slots = [], []
    for context_len, query_len in seqs:
        count = math.ceil(context_len / page_size)
        pages, free = free[:count], free[count:]
        page_ids.append(pages)
        slots = slot_ids_of(pages, 0, context_len, page_size)
        write(torch.tensor(slots), context_len)
        new_slots += slots[context_len - query_len:]
    return page_ids, new_slots


def as_format(cache: torch.Tensor, kv_dtype: str) -> KVPages:
    """float32 pages (num_pages, page_size, KVH, D) stored in the KV format `kv_dtype` (kernels/kv_format.py)."""
    pages = KVPages.zeros(kv_dtype, tuple(cache.shape), "cpu")
    pages.store(torch.arange(cache.shape[0] * cache.shape[1]), cache.view(-1, *cache.shape[2:]))
    return pages
