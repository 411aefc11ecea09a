"""Pages between a pool and the disk tier: what is stored is what the page held when it was handed over."""

import torch

from cache import PageAllocator, RadixTree, hash_pages
from cache.kv_pool import KVPool, KVPoolShape
from cache.page_events import PageEvent, PageEventKind
from cache.page_hash import ROOT_PAGE_HASH
from engine.kv_tier_link import KVTierLink, open_disk_tier_link

PAGE_SIZE = 4


def _pool(dtype=torch.float32) -> KVPool:
    pool = KVPool(KVPoolShape(num_layers=3, num_kv_heads=2, head_dim=8, page_size=PAGE_SIZE, dtype=dtype), 8,
                  torch.device("cpu"))
    for layer, (k_cache, v_cache) in enumerate(pool.layers):
        k_cache.values.copy_(torch.randn(k_cache.shape, generator=torch.Generator().manual_seed(layer)))
        v_cache.values.copy_(torch.randn(v_cache.shape, generator=torch.Generator().manual_seed(100 + layer)))
    return pool


def _link(tmp_path, pool: KVPool, policy: str = "write-through") -> KVTierLink:
    (tmp_path / "model").mkdir(parents=True, exist_ok=True)
    (tmp_path / "model" / "config.json").write_text("{}")
    return open_disk_tier_link(tmp_path / "kv", 1 << 20, policy, tmp_path / "model", pool, "cpu")


def _page(pool: KVPool, page_id: int) -> list[torch.Tensor]:
    return [plane[page_id].clone() for plane in pool.tier_planes]


def test_a_page_overwritten_right_after_it_was_handed_over_is_stored_as_it_was(tmp_path):
    for dtype in (torch.float32, torch.bfloat16):
        pool = _pool(dtype)
        link = _link(tmp_path / str(dtype), pool)
        page_hash = hash_pages(b"", [1, 2, 3, 4], PAGE_SIZE, None)[0]
        before = _page(pool, 2)
        link.on_page_event(PageEvent(PageEventKind.STORED, (page_hash,), (2,)))
        for plane in pool.tier_planes:  # the slot is reused at once
            plane[2].fill_(7.0)
        link.tier.flush()
        assert link._load([page_hash], [5]) == 1
        assert all(torch.equal(a, b) for a, b in zip(_page(pool, 5), before))
        link.close()


def test_extend_match_loads_the_chain_into_the_tree_and_keeps_pages_balanced(tmp_path):
    pool = _pool()
    link = _link(tmp_path, pool)
    tokens = list(range(20))  # 5 pages
    hashes = hash_pages(b"", tokens, PAGE_SIZE, "salt")
    link.on_page_event(PageEvent(PageEventKind.STORED, tuple(hashes[:4]), (0, 1, 2, 3)))
    expected = [_page(pool, page_id) for page_id in range(4)]
    link.tier.flush()
    link.close()

    pool = _pool()  # a new process: other contents in every slot
    link = _link(tmp_path, pool)
    allocator = PageAllocator(pool.num_pages)
    tree = RadixTree(PAGE_SIZE, allocator)
    def chain(salt):  # the 4 pages' chained hashes, as a request keeps them
        return hash_pages(ROOT_PAGE_HASH, tokens[: 4 * PAGE_SIZE], PAGE_SIZE, salt)

    assert link.extend_match(tree, tokens, "other salt", tree.match_prefix(tokens, "other salt"),
                             chain("other salt")).num_tokens == 0
    match = link.extend_match(tree, tokens, "salt", tree.match_prefix(tokens, "salt"), chain("salt"))
    assert match.num_tokens == 4 * PAGE_SIZE and tree.page_hashes(match.last_node) == hashes[:4]
    loaded = [_page(pool, page_id) for page_id in match.page_ids]
    assert all(torch.equal(a, b) for got, want in zip(loaded, expected) for a, b in zip(got, want))
    assert allocator.num_free_pages + tree.num_cached_pages == pool.num_pages
    assert (link.num_query_tokens, link.num_hit_tokens) == (8 * PAGE_SIZE, 4 * PAGE_SIZE)
    link.close()
