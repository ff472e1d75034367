"""Prometheus metrics of one control-plane process (its own registry, so tests can run several).

Counters and the latency histogram are updated as things happen; the gauges that describe the
cluster (queue depth, allocation per resource, per-device usage) are read from the scheduler's
state when `/metrics` is scraped, so they are never stale and cost nothing between scrapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from finesched.state.cluster import ClusterState
from finesched.state.devices import attach_device_accounts

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.decisions = Counter(
            "finesched_decisions", "Scheduling decisions made durable, by result.", ["result"], registry=self.registry
        )
        self.bind_latency = Histogram(
            "finesched_submit_to_bound_seconds",
            "Time from a workload's submission to its durable binding.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.cycle_latency = Histogram(
            "finesched_batch_seconds",
            "Time to decide one batch and write it to the store.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        # CPU time (of the thread doing it) of the parts of a batch and of a submission: what the
        # benchmark's breakdown (bench/api.py --breakdown) sets against the process's CPU time.
        self.decide_seconds = Histogram(
            "finesched_decide_cpu_seconds",
            "CPU time the scheduling core takes to decide one batch (Scheduler.run, no I/O).",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.bind_write_seconds = Histogram(
            "finesched_bind_write_cpu_seconds",
            "CPU time of writing one batch of bindings to the store (one transaction, commit included).",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.feed_seconds = Histogram(
            "finesched_feed_cpu_seconds",
            "CPU time of reading the change feed and reconciling what other writers changed, per loop cycle.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.submit_store_seconds = Histogram(
            "finesched_submit_store_cpu_seconds",
            "CPU time of storing the workloads of one submission request (one transaction, commit included).",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.moves = Counter(
            "finesched_defragmentation_moves",
            "Running workloads moved by the defragmenter to make room for a waiting one (made durable).",
            registry=self.registry,
        )
        self.write_conflicts = Counter(
            "finesched_bind_conflicts", "Bindings not written because the workload changed.", registry=self.registry
        )
        self.leader = Gauge(
            "finesched_leader", "1 when this replica holds the scheduler lease.", registry=self.registry
        )
        self.requests = Counter(
            "finesched_http_requests",
            "HTTP requests by method and status.",
            ["method", "status"],
            registry=self.registry,
        )

    def observe_cluster(self, snapshot: Callable[[], dict[str, Any] | None]) -> None:
        """Register the scrape-time collector; `snapshot()` returns the cluster figures (None: not leader)."""
        self.registry.register(_ClusterCollector(snapshot))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ClusterCollector(Collector):
    def __init__(self, snapshot: Callable[[], dict[str, Any] | None]):
        self.snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        figures = self.snapshot()
        if figures is None:
            return
        depth = GaugeMetricFamily("finesched_queue_depth", "Workloads waiting to be scheduled.")
        depth.add_metric([], figures["queue_depth"])
        yield depth
        allocated = GaugeMetricFamily("finesched_allocated", "Allocated amount per resource.", labels=["resource"])
        capacity = GaugeMetricFamily("finesched_capacity", "Allocatable amount per resource.", labels=["resource"])
        for name, (used, total) in figures["resources"].items():
            allocated.add_metric([name], used)
            capacity.add_metric([name], total)
        yield allocated
        yield capacity
        device = GaugeMetricFamily(
            "finesched_device_used_ratio",
            "Used share of each device dimension (0-1).",
            labels=["node", "type", "minor", "dimension"],
        )
        for (node, kind, minor, dim), ratio in figures["devices"].items():
            device.add_metric([node, kind, str(minor), dim], ratio)
        yield device


def cluster_figures(state: ClusterState, queue_depth: int) -> dict[str, Any]:
    """What the scrape-time gauges show: queue depth, (used, total) per resource, and the used share
    of every device dimension by (node, type, minor, dimension)."""
    accounts = attach_device_accounts(state)
    device_used = accounts.used()  # device dimensions are not scalar columns of the state
    resources = {
        name: (device_used[name] if name in device_used else int(state.used_of(name).sum()), total)
        for name, total in state.totals().items()
    }
    devices: dict[tuple[str, str, int, str], float] = {}
    for kind, acc in accounts.types.items():
        for i in range(state.n):
            for d in range(int(acc.count[i])):
                for k, dim in enumerate(acc.dims):
                    total = int(acc.total[k, i, d])
                    if total > 0:
                        devices[(state.names[i], kind, int(acc.minor[i, d]), dim)] = (
                            total - int(acc.free[k, i, d])
                        ) / total
    return {"queue_depth": queue_depth, "resources": resources, "devices": devices}
