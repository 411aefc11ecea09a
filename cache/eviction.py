"""Eviction policies: which unlocked leaf of the radix tree goes first."""

from abc import ABC, abstractmethod

from cache.tree_node import TreeNode


class EvictionPolicy(ABC):
    """Orders evictable leaves; the tree evicts the leaf with the smallest priority first.

    ``priority`` reads the node and changes nothing. It is called for leaves only (never the
    root, never a locked node), when the tree builds its eviction heap.
    """

    @abstractmethod
    def priority(self, node: TreeNode) -> tuple[int, ...]: ...


class LRUPolicy(EvictionPolicy):
    """Least recently used first. Times are the tree's match/insert counter, not wall time."""

    def priority(self, node: TreeNode) -> tuple[int, ...]:
        return (node.last_access_time,)


class LFUPolicy(EvictionPolicy):
    """Fewest prefix-match hits first; least recently used among equal hit counts."""

    def priority(self, node: TreeNode) -> tuple[int, ...]:
        return (node.hit_count, node.last_access_time)
