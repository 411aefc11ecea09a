"""The plain single-request greedy path: no scheduler, no prefix cache.

Used by `radixserve generate` and as the reference the batched engine is tested
against. The sequence's KV lives in a private pool whose pages are simply
0, 1, 2, ... in order. Device, dtype, backend and stop tokens resolve as the
engine's do (engine/engine_config.py, `stop_token_ids`).
"""

import json
from pathlib import Path

import torch

from cache.kv_pool import KVPool, KVPoolShape
from engine.engine_config import resolve_device, resolve_dtype
from engine.step_batch import SequenceChunk, build_step_batch, rows_past_prompt, run_step
from model.decoder import DecoderForCausalLM
from model.weights import load_model

PAGE_SIZE = 16


def stop_token_ids(model_dir: Path, eos_token_ids: tuple[int, ...]) -> frozenset[int]:
    """The model's end-of-sequence ids: config.json's and generation_config.json's."""
    path = Path(model_dir) / "generation_config.json"
    eos = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
    extra = () if eos is None else tuple(eos) if isinstance(eos, list) else (int(eos),)
    return frozenset(eos_token_ids + extra)


def greedy_generate(
    model: DecoderForCausalLM,
    prompt_ids: list[int],
    max_new_tokens: int,
    stop_token_ids: frozenset[int] | tuple[int, ...] = (),
) -> list[int]:
    """Greedy continuation of `prompt_ids`: new token ids, ending at a stop
    token (included) or after `max_new_tokens`."""
    config = model.config
    device = model.norm.weight.device
    max_len = len(prompt_ids) + max_new_tokens
    num_pages = -(-max_len // PAGE_SIZE)
    shape = KVPoolShape(config.num_layers, config.num_kv_heads, config.head_dim, PAGE_SIZE, model.norm.weight.dtype)
    pool = KVPool(shape, num_pages, device)
    page_ids = list(range(num_pages))

    def step(token_ids: list[int], start: int) -> torch.Tensor:
        num_generated = rows_past_prompt(start, start + len(token_ids), len(prompt_ids))
        batch = build_step_batch([SequenceChunk(token_ids, start, page_ids, num_generated_rows=num_generated)],
                                 PAGE_SIZE, device)
        return run_step(model, pool.layers, batch).sampled[0]  # (V,)

    output_ids: list[int] = []
    logits = step(prompt_ids, 0)
    while True:
        next_id = int(torch.argmax(logits))
        output_ids.append(next_id)
        if next_id in stop_token_ids or len(output_ids) >= max_new_tokens:
            return output_ids
        logits = step([next_id], len(prompt_ids) + len(output_ids) - 1)


def load(model_dir: Path, dtype: str = "auto", device: str = "auto", backend: str = "auto") -> DecoderForCausalLM:
    """The model as the engine loads it for the same settings."""
    resolved_device = resolve_device(device)
    return load_model(Path(model_dir), resolved_device, resolve_dtype(dtype, resolved_device), backend=backend)
