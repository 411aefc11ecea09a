"""Routing by cached prefix, without Ray: the policy and index that the Ray router delegates to."""

import pytest

from cache import hash_pages
from replicas.prefix_index import PrefixIndex
from replicas.prefix_policy import PrefixRoutingPolicy, RoutingThresholds

PAGE = 4


def pages(token_ids, salt=None):
    return hash_pages(b"", token_ids, PAGE, salt)


SYSTEM = list(range(100, 116))  # 4 pages every request shares
SESSION_A = SYSTEM + list(range(200, 216))
SESSION_B = SYSTEM + list(range(300, 316))


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_longest_cached_prefix_wins_over_a_shorter_one():
    policy = PrefixRoutingPolicy()
    policy.index.apply_snapshot("r0", 1, pages(SYSTEM))
    policy.index.apply_snapshot("r1", 1, pages(SESSION_A))
    decision = policy.choose(["r0", "r1"], pages(SESSION_A + [7, 7, 7, 7]))
    assert decision.ranked_replica_ids == ["r1", "r0"]
    assert (decision.reason, decision.num_matched_pages) == ("prefix", 8)


def test_only_leading_pages_count():
    """A replica holding a later page but not the first has no usable prefix (hashes are chained,
    so a later page's hash can only match after the same first pages anyway)."""
    policy = PrefixRoutingPolicy(thresholds=RoutingThresholds(min_match_ratio=0))
    request = pages(SESSION_A)
    policy.index.apply_snapshot("r0", 1, request[1:])  # everything but the first page
    policy.index.apply_snapshot("r1", 1, request[:1])
    assert policy.choose(["r0", "r1"], request).ranked_replica_ids[0] == "r1"


def test_salt_keeps_tenants_apart():
    policy = PrefixRoutingPolicy()
    policy.index.apply_snapshot("r0", 1, pages(SESSION_A, salt="tenant-a"))
    decision = policy.choose(["r1", "r0"], pages(SESSION_A, salt="tenant-b"))
    assert (decision.reason, decision.num_matched_pages) == ("least_loaded", 0)


def test_no_match_goes_to_the_least_loaded():
    policy = PrefixRoutingPolicy()
    policy.record_routed("r0", [], None)
    assert policy.choose(["r0", "r1"], pages(SESSION_B)).ranked_replica_ids == ["r1", "r0"]


def test_equal_match_breaks_ties_by_load():
    policy = PrefixRoutingPolicy()
    for replica in ("r0", "r1"):
        policy.index.apply_snapshot(replica, 1, pages(SYSTEM))
    policy.record_routed("r0", [], None)
    decision = policy.choose(["r0", "r1"], pages(SESSION_B))
    assert (decision.ranked_replica_ids[0], decision.reason) == ("r1", "prefix")


def test_a_match_below_the_ratio_does_not_pull_the_request():
    """As SGLang's cache_threshold: a replica holding 4 of a request's 12 pages (under half) does not
    get it for that; the least loaded does."""
    policy = PrefixRoutingPolicy(thresholds=RoutingThresholds(min_match_ratio=0.5))
    policy.index.apply_snapshot("r0", 1, pages(SYSTEM))
    policy.record_routed("r0", [], None)
    request = pages(SYSTEM + list(range(400, 432)))
    assert policy.choose(["r0", "r1"], request).ranked_replica_ids == ["r1", "r0"]
    assert policy.choose(["r0", "r1"], pages(SESSION_B)).ranked_replica_ids[0] == "r0"  # 4 of 8: enough


def test_imbalanced_load_falls_back_to_the_least_loaded():
    policy = PrefixRoutingPolicy(thresholds=RoutingThresholds(balance_abs=2, balance_rel=1.5))
    policy.index.apply_snapshot("r0", 1, pages(SESSION_A))
    for _ in range(3):
        policy.record_routed("r0", [], None)
    decision = policy.choose(["r0", "r1"], pages(SESSION_A))
    assert (decision.ranked_replica_ids, decision.reason) == (["r1", "r0"], "imbalanced")
    # Once the load evens out, the cached prefix wins again.
    policy.record_finished("r0")
    policy.record_finished("r0")
    assert policy.choose(["r0", "r1"], pages(SESSION_A)).ranked_replica_ids[0] == "r0"


def test_both_thresholds_must_be_exceeded():
    policy = PrefixRoutingPolicy(thresholds=RoutingThresholds(balance_abs=2, balance_rel=3.0))
    policy.index.apply_snapshot("r0", 1, pages(SESSION_A))
    for _ in range(5):
        policy.record_routed("r0", [], None)
    for _ in range(2):
        policy.record_routed("r1", [], None)
    # 5 - 2 > 2 but 5 < 3 * 2: balanced enough, the prefix wins.
    assert policy.choose(["r0", "r1"], pages(SESSION_A)).reason == "prefix"


def test_affinity_key_sticks_when_no_prefix_is_known():
    policy = PrefixRoutingPolicy()
    policy.record_routed("r1", [], "session-7")
    policy.record_routed("r1", [], None)  # r1 is busier: without the key r0 would win
    decision = policy.choose(["r0", "r1"], pages([9] * 8), affinity_key="session-7")
    assert (decision.ranked_replica_ids[0], decision.reason) == ("r1", "affinity")
    assert policy.choose(["r0", "r1"], pages([9] * 8), affinity_key="other").ranked_replica_ids[0] == "r0"


def test_affinity_breaks_equal_prefix_ties():
    policy = PrefixRoutingPolicy()
    for replica in ("r0", "r1"):
        policy.index.apply_snapshot(replica, 1, pages(SYSTEM))
    policy.record_routed("r1", [], "session-7")
    assert policy.choose(["r0", "r1"], pages(SESSION_B), affinity_key="session-7").ranked_replica_ids[0] == "r1"


def test_routed_pages_count_at_once_and_expire():
    clock = FakeClock()
    policy = PrefixRoutingPolicy(PrefixIndex(routed_ttl_s=10, clock=clock))
    policy.record_routed("r1", pages(SESSION_A), None)
    policy.record_finished("r1")
    assert policy.choose(["r0", "r1"], pages(SESSION_A)).ranked_replica_ids[0] == "r1"
    clock.now = 11
    assert policy.choose(["r0", "r1"], pages(SESSION_A)).reason == "least_loaded"


def test_stale_index_only_misroutes_it_never_fails():
    """The index says r0 holds the prefix but r0 evicted it: the request still goes somewhere
    (r0, which recomputes), and the next snapshot corrects the index."""
    policy = PrefixRoutingPolicy()
    policy.index.apply_snapshot("r0", 1, pages(SESSION_A))
    assert policy.choose(["r0", "r1"], pages(SESSION_A)).ranked_replica_ids == ["r0", "r1"]
    policy.index.apply_snapshot("r0", 2, [])
    assert policy.choose(["r0", "r1"], pages(SESSION_A)).reason == "least_loaded"


def test_older_snapshots_are_ignored():
    index = PrefixIndex()
    assert index.apply_snapshot("r0", 2, pages(SYSTEM))
    assert not index.apply_snapshot("r0", 1, [])
    assert index.num_leading_pages("r0", pages(SYSTEM)) == 4


def test_a_dead_replica_is_forgotten():
    policy = PrefixRoutingPolicy()
    policy.index.apply_snapshot("r0", 1, pages(SESSION_A))
    policy.record_routed("r0", pages(SESSION_A), "session-7")
    policy.drop_replica("r0")
    assert policy.index.num_pages("r0") == 0 and policy.num_in_flight("r0") == 0
    decision = policy.choose(["r1", "r2"], pages(SESSION_A), affinity_key="session-7")
    assert (decision.ranked_replica_ids[0], decision.reason) == ("r1", "least_loaded")


def test_affinity_keys_are_bounded():
    policy = PrefixRoutingPolicy(max_affinity_keys=2)
    for key in ("a", "b", "c"):
        policy.record_routed("r1", [], key)
    assert policy.choose(["r0", "r1"], [], affinity_key="a").reason != "affinity"
    assert policy.choose(["r0", "r1"], [], affinity_key="c").reason == "affinity"


def test_thresholds_are_validated():
    with pytest.raises(ValueError):
        RoutingThresholds(balance_rel=0.5)
