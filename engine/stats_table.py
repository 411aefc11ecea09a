"""The metric table behind /metrics: a stats dataclass's fields that are Prometheus series say so with
`metric(...)` (name, gauge or counter, help; whether replicas report it per replica too); a field whose value
is itself a stats dataclass (a feature's: engine/kv_disk_stats.py, engine/document_reuse_stats.py,
engine/speculation_stats.py) contributes its own series; a class's `DERIVED_METRICS` are series computed from
several of its fields. `stats_metrics(EngineStats)` is the one table that the server's /metrics
(server/metrics.py) and the replicas' per-replica series (replicas/replica_metrics.py) iterate.

Pure Python (no torch).
"""

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StatsMetric:
    """One Prometheus series read from a stats snapshot at scrape time (name without the `radixserve:` prefix)."""

    name: str
    kind: str  # "gauge" or "counter"
    help: str
    value: Callable[[Any], float]
    per_replica: bool = False  # replicas also report it per replica, as `replica_<name>{replica=...}`


def metric(name: str, kind: str, help: str, per_replica: bool = False, **default) -> dataclasses.Field:
    """A stats field that is a series of its own; `default=` as dataclasses.field's."""
    return field(metadata={"metric": (name, kind, help, per_replica)}, **default)


def _is_stats(value_type) -> bool:
    return isinstance(value_type, type) and dataclasses.is_dataclass(value_type)


def stats_metrics(stats_class: type) -> tuple[StatsMetric, ...]:
    """Every series of `stats_class`: its `metric` fields, its features' (nested stats fields), its derived."""
    metrics = []
    for stats_field in dataclasses.fields(stats_class):
        if "metric" in stats_field.metadata:
            name, kind, help, per_replica = stats_field.metadata["metric"]
            metrics.append(StatsMetric(name, kind, help, _getter(stats_field.name), per_replica))
        elif _is_stats(stats_field.type):
            metrics += [dataclasses.replace(inner, value=_nested(stats_field.name, inner.value))
                        for inner in stats_metrics(stats_field.type)]
    return tuple(metrics) + tuple(getattr(stats_class, "DERIVED_METRICS", ()))


def _getter(name: str) -> Callable[[Any], float]:
    return lambda stats: getattr(stats, name)


def _nested(name: str, value: Callable[[Any], float]) -> Callable[[Any], float]:
    return lambda stats: value(getattr(stats, name))


def sum_stats(stats_class: type, snapshots: Iterable):
    """Field by field sum of several snapshots (replicas' stats), nested stats summed the same way."""
    snapshots = list(snapshots)
    values = {}
    for stats_field in dataclasses.fields(stats_class):
        parts = [getattr(snapshot, stats_field.name) for snapshot in snapshots]
        values[stats_field.name] = (sum_stats(stats_field.type, parts) if _is_stats(stats_field.type)
                                    else sum(parts))
    return stats_class(**values)


def stats_from_dict(stats_class: type, values: dict):
    """`dataclasses.asdict(snapshot)` back into the snapshot (what a replica reports travels as a dict)."""
    return stats_class(**{stats_field.name: stats_from_dict(stats_field.type, values[stats_field.name])
                          if _is_stats(stats_field.type) else values[stats_field.name]
                          for stats_field in dataclasses.fields(stats_class) if stats_field.name in values})
