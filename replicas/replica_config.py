"""`serve --replicas`' settings (replicas/serve_command.py). Pure Python (no Ray): `radixserve --help`
derives the flags from these fields."""

from dataclasses import dataclass

from engine.setting import setting
from replicas.prefix_policy import (DEFAULT_BALANCE_ABS, DEFAULT_BALANCE_REL, DEFAULT_MIN_MATCH_RATIO,
                                    RoutingThresholds)

REPLICA_ROUTERS = ("prefix", "pow2")


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(f"must be positive, got {value}")
    return value


@dataclass(frozen=True)
class ReplicaConfig:
    # None: one engine in this process, no Ray
    count: int | None = setting(
        None, "serve with N engine replicas on Ray Serve behind this one endpoint, routed by cached prefix "
        "(default: one engine in this process, no Ray)", flag="--replicas", parse=_positive_int, metavar="N")
    threads_per_replica: int = setting(1, "CPU threads of each replica's engine", parse=_positive_int, metavar="T")
    ray_address: str | None = setting(
        None, "join this Ray cluster ('auto': the one `ray start` runs here) instead of starting one", metavar="ADDR")
    router: str = setting(
        "prefix", "prefix: longest cached prefix unless load is imbalanced; pow2: Ray Serve's default "
        "power-of-two-choices", flag="--replica-router", choices=REPLICA_ROUTERS)
    balance_abs_threshold: int = setting(
        DEFAULT_BALANCE_ABS, "route by load, not cache, while in-flight requests differ by more than N and...", metavar="N")
    balance_rel_threshold: float = setting(
        DEFAULT_BALANCE_REL, "...the busiest replica has more than R times the least busy one's", metavar="R")
    min_match_ratio: float = setting(
        DEFAULT_MIN_MATCH_RATIO, "a replica's cached prefix draws a request only when it covers at least this share of the "
        "request's pages", metavar="F")

    def __post_init__(self):
        if self.router not in REPLICA_ROUTERS:
            raise ValueError(f"replica router must be one of {', '.join(REPLICA_ROUTERS)}, got {self.router!r}")
        self.thresholds  # noqa: B018  (ValueError for a threshold out of range)

    @property
    def thresholds(self) -> RoutingThresholds:
        return RoutingThresholds(self.balance_abs_threshold, self.balance_rel_threshold, self.min_match_ratio)
