"""The prefix router's own cost per request, with N prefixes indexed (no Ray, no model).

Builds an index of `num_prefixes` distinct prefixes (each `num_pages` pages, spread over the
replicas as sessions would be), then times, per request: hashing its prompt's pages (done at the
ingress), and the routing decision + recording it (what the Ray router calls), under the lock.

    python -m bench.replica_router_cost [--num-prefixes 10000] [--num-pages 64] [--num-replicas 2]
"""

import argparse
import random
import time

from cache.page_hash import ROOT_PAGE_HASH, hash_pages
from replicas.prefix_policy import PrefixRoutingPolicy
from replicas.routing_state import RoutingState

PAGE_SIZE = 16


def measure(num_prefixes: int, num_pages: int, num_replicas: int, num_requests: int = 2000, seed: int = 0) -> dict:
    rng = random.Random(seed)
    replica_ids = [f"replica-{i}" for i in range(num_replicas)]
    system = [rng.randrange(49152) for _ in range(PAGE_SIZE * 8)]  # 8 pages every prefix shares
    prompts, snapshots = [], {r: set() for r in replica_ids}
    for i in range(num_prefixes):
        tokens = system + [rng.randrange(49152) for _ in range(PAGE_SIZE * (num_pages - 8))]
        prompts.append(tokens)
        snapshots[replica_ids[i % num_replicas]].update(hash_pages(ROOT_PAGE_HASH, tokens, PAGE_SIZE, None))
    state = RoutingState(PrefixRoutingPolicy())
    state.sync_replicas({r: {"page_hashes_version": 1, "page_hashes": list(h)} for r, h in snapshots.items()})
    hash_s, route_s = [], []
    for _ in range(num_requests):
        # A later turn of an indexed session: its prefix plus two new pages.
        tokens = rng.choice(prompts) + [rng.randrange(49152) for _ in range(PAGE_SIZE * 2)]
        start = time.perf_counter()
        page_hashes = hash_pages(ROOT_PAGE_HASH, tokens, PAGE_SIZE, None)
        hashed = time.perf_counter()
        decision = state.choose(replica_ids, page_hashes, None)
        state.record_routed(decision.ranked_replica_ids[0], page_hashes, None)
        state.record_finished(decision.ranked_replica_ids[0])
        route_s.append(time.perf_counter() - hashed)
        hash_s.append(hashed - start)
    hash_s.sort()
    route_s.sort()
    return {"num_indexed_pages": sum(len(h) for h in snapshots.values()),
            "hash_p50_ms": 1e3 * hash_s[len(hash_s) // 2], "route_p50_ms": 1e3 * route_s[len(route_s) // 2],
            "route_p99_ms": 1e3 * route_s[int(len(route_s) * 0.99)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prefixes", type=int, default=10_000)
    parser.add_argument("--num-pages", type=int, default=64, help="pages of each indexed prefix (16 tokens each)")
    parser.add_argument("--num-replicas", type=int, default=2)
    args = parser.parse_args()
    result = measure(args.num_prefixes, args.num_pages, args.num_replicas)
    print(f"{args.num_prefixes} prefixes x {args.num_pages} pages over {args.num_replicas} replicas "
          f"({result['num_indexed_pages']} distinct page hashes indexed), a request of {args.num_pages + 2} pages: "
          f"hashing {result['hash_p50_ms']:.3f} ms p50 (at the ingress); routing + recording "
          f"{result['route_p50_ms']:.3f} ms p50, {result['route_p99_ms']:.3f} ms p99")


if __name__ == "__main__":
    main()
