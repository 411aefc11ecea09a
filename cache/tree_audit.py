"""Read-only audits of a RadixTree, for tests and debug checks (O(cached tokens) each).

They use only the tree's public surface (root, page_size, the num_* counters) and node fields.
"""

from cache.page_hash import ROOT_PAGE_HASH, DerivedSalt, hash_pages
from cache.radix_tree import RadixTree
from cache.tree_node import TreeNode

# (cache_salt, tokens of a full-page prefix) -> id of the page holding that prefix's last page
PrefixPages = dict[tuple[str | None, tuple[int, ...]], int]


def cached_prefix_pages(tree: RadixTree) -> PrefixPages:
    """Every cached full-page prefix, one entry per page."""
    prefix_pages: PrefixPages = {}
    for node, path_token_ids in _walk(tree):
        start = len(path_token_ids) - len(node.token_ids)
        for page_index, page_id in enumerate(node.page_ids):
            end = start + (page_index + 1) * tree.page_size
            prefix_pages[(node.cache_salt, path_token_ids[:end])] = page_id
    return prefix_pages


def cached_page_ids(tree: RadixTree) -> list[int]:
    """Every page id the tree holds a reference on."""
    return [page_id for node, _ in _walk(tree) for page_id in node.page_ids]


def check_tree_invariants(tree: RadixTree) -> None:
    """Raise AssertionError naming the first broken invariant of the tree's structure."""
    page_size = tree.page_size
    num_locked_pages = num_evictable_pages = 0
    seen_page_ids: set[int] = set()
    for node, path_token_ids in _walk(tree):
        parent = node.parent
        _require(node.num_pages >= 1, f"{node} holds no pages")
        _require(len(node.token_ids) == node.num_pages * page_size, f"{node} has a partial page")
        _require(len(node.page_hashes) == node.num_pages, f"{node} has a page without a hash")
        key = (node.cache_salt, node.token_ids[:page_size])
        _require(parent.children.get(key) is node, f"{node} is not under its key in its parent")
        is_same_key = parent is tree.root or parent.cache_salt == node.cache_salt
        # derived KV hangs below the exact node of the same tenant where the exact KV ended
        is_derived_below_exact = (isinstance(node.cache_salt, DerivedSalt) and parent is not tree.root
                                  and parent.cache_salt == node.cache_salt.salt)
        _require(is_same_key or is_derived_below_exact, "cache_salt mixed on a path")
        _require(node.lock_ref >= 0, f"{node} has a negative lock_ref")
        if parent is not tree.root:
            _require(parent.lock_ref >= node.lock_ref, f"{node} locked more than its parent")
            _require(
                parent.last_access_time >= node.last_access_time, f"{node} newer than its parent"
            )
            _require(parent.hit_count >= node.hit_count, f"{node} hit more than its parent")
        _require(seen_page_ids.isdisjoint(node.page_ids), f"{node} shares a page with another node")
        seen_page_ids.update(node.page_ids)
        parent_hash = parent.page_hashes[-1] if parent.page_hashes else ROOT_PAGE_HASH
        expected_hashes = hash_pages(parent_hash, node.token_ids, page_size, node.cache_salt)
        _require(node.page_hashes == expected_hashes, f"{node} has wrong page hashes")
        if node.lock_ref:
            num_locked_pages += node.num_pages
        else:
            num_evictable_pages += node.num_pages
    _require(tree.num_locked_pages == num_locked_pages, "num_locked_pages is off")
    _require(tree.num_evictable_pages == num_evictable_pages, "num_evictable_pages is off")


def _walk(tree: RadixTree):
    """Yield (node, tokens from the root through the node) for every node but the root."""
    stack: list[tuple[TreeNode, tuple[int, ...]]] = [(tree.root, ())]
    while stack:
        node, path_token_ids = stack.pop()
        if node is not tree.root:
            yield node, path_token_ids
        for child in node.children.values():
            stack.append((child, path_token_ids + child.token_ids))


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)
