"""The plain single-request greedy path: no scheduler, no prefix cache.

Used by `radixserve generate` and as the reference the batched engine is tested
against. The sequence's KV lives in a private pool whose pages are simply
0, 1, 2, ... in order.
"""

from pathlib import Path

import torch

from cache.kv_pool import KVPool, KVPoolShape
from model.llama import LlamaForCausalLM
from model.weights import load_model
from kernels.paged_attention import AttentionInputs

PAGE_SIZE = 16


def resolve_dtype(name: str) -> torch.dtype:
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "auto": torch.float32}
    if name not in dtypes:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(dtypes)}")
    return dtypes[name]


def greedy_generate(
    model: LlamaForCausalLM,
    prompt_ids: list[int],
    max_new_tokens: int,
    stop_token_ids: tuple[int, ...] = (),
) -> list[int]:
    """Greedy continuation of `prompt_ids`: new token ids, ending at a stop
    token (included) or after `max_new_tokens`."""
    config = model.config
    device = model.embed_tokens.weight.device
    max_len = len(prompt_ids) + max_new_tokens
    num_pages = -(-max_len // PAGE_SIZE)
    shape = KVPoolShape(config.num_layers, config.num_kv_heads, config.head_dim, PAGE_SIZE, model.embed_tokens.weight.dtype)
    pool = KVPool(shape, num_pages, device)
    page_ids = list(range(num_pages))

    def step(token_ids: list[int], start: int) -> torch.Tensor:
        attn = AttentionInputs.build(
            slot_ids=list(range(start, start + len(token_ids))),  # pages in order: slot == position
            query_lens=[len(token_ids)],
            context_lens=[start + len(token_ids)],
            page_ids_per_seq=[page_ids],
            device=device,
        )
        hidden = model(
            torch.tensor(token_ids, device=device),
            attn.positions,
            pool.layers,
            attn,
        )
        return model.compute_logits(hidden[-1:])[0]  # (V,)

    output_ids: list[int] = []
    logits = step(prompt_ids, 0)
    while True:
        next_id = int(torch.argmax(logits))
        output_ids.append(next_id)
        if next_id in stop_token_ids or len(output_ids) >= max_new_tokens:
            return output_ids
        logits = step([next_id], len(prompt_ids) + len(output_ids) - 1)


def load(model_dir: Path, dtype: str = "float32", device: str = "cpu") -> LlamaForCausalLM:
    return load_model(Path(model_dir), torch.device(device), resolve_dtype(dtype))
