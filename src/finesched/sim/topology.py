"""The topology experiment (`finesched sim topology`): gangs of 2-64 GPUs beside the trace's pods,
in a cluster arranged into racks and blocks, placed topology-unaware, by BestFit and by KeepDomainsWhole.

**Cluster.** The node list (the Alibaba GPU node list, or `generate_nodes`: N nodes of 8 GPUs) in
file order, cut into racks of `rack_size` nodes and blocks of `block_size` racks; every node gets
the labels ``topology.finesched.io/block`` (``b0``, ``b1``, ...), ``topology.finesched.io/rack``
(``r0``, ``r1``, ..., numbered across the cluster) and ``kubernetes.io/hostname`` (its name), and
one Topology ``dc`` has those three levels.

**Gangs.** Poisson arrivals at `gang_rate` per simulated hour over the first `hours` of the run; a
gang's member count is drawn from `gang_mix` ({members: weight}); with probability
`fractional_share` its members ask a GPU share (`share_milli` of one GPU each, members may share a
card), else one whole GPU each. Every member also asks 1 CPU and 4 GiB. A gang runs for an
exponential duration of mean `gang_duration` seconds, then all its members leave together.

**Level rule.** A gang asks ``topology: {name: dc, required: topology.finesched.io/rack}`` when its
GPU demand (members x 1, or members x share) is at most `rack_limit` GPUs, and ``required: block``
otherwise. `rack_limit` defaults to the median GPU count of a rack, so "fits a rack" means "fits
a typical rack"; `level` = ``rack`` or ``block`` asks every gang for that level instead.

**Background.** The trace's pods (all, or only the GPU-share ones with `background="share"`, or
none) arrive at their creation time / `time_scale`, run for their trace duration and leave, as in
`sim replay` (whose event loop this experiment extends: sim/replay.py).

**Policies.** ``unaware``: the same gangs without ``topology``; ``BestFit`` and ``KeepDomainsWhole``:
the gangs with ``topology``, and the profile's ``topologyPolicy``. Every policy uses the same node
score (`node_policy`, a `sim` policy) for the members inside the domain and for the trace's pods.

**Reported.** Share of placed gangs whose members all sit in one rack / one block (from the
bindings), gang wait (first placement - arrival, simulated seconds: mean, p99), gangs never
placed, trace pods' wait, GPU allocation over time and the number of whole racks (every GPU of
every node free) over time. Everything is seeded: one seed gives the same gangs to every policy.

The cluster, the gangs and the trace's pods are built in sim/topology_workload.py; this module runs
them through the replay loop and measures.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from finesched.model.node import Node
from finesched.model.topology import RACK_LABEL
from finesched.model.workload import Workload
from finesched.plugins.fragmentation import GpuView
from finesched.sched.scheduler import Scheduler
from finesched.sim import metrics
from finesched.sim.experiment import Progress
from finesched.sim.policies import policy_profile, sim_registry
from finesched.sim.replay import _Replay, _step_through
from finesched.sim.topology_workload import (
    GANG_NAMESPACE,
    UNAWARE,
    FloatArray,
    Gangs,
    IntArray,
    TopologyConfig,
    arrange,
    background_pods,
    default_rack_limit,
    gang_members,
    make_gangs,
    resolve_topology_policy,
    topology,
    trace_origin,
)
from finesched.sim.trace import MILLI_PER_GPU, NodeTable, PodTable
from finesched.state.cluster import ClusterState
from finesched.state.topology import build_index


# Run ---------------------------------------------------------------------------------------------------
@dataclass
class TopologyRun:
    """One policy x seed: gang placement quality, waits, and time series (simulated seconds)."""

    policy: str
    seed: int
    gangs: int
    placed: int
    in_rack: int
    in_block: int
    gang_waits: FloatArray
    pod_waits: FloatArray
    pods_unplaced: int
    times: FloatArray
    alloc: FloatArray
    free_racks: IntArray
    racks: int
    wall_s: float
    #: The arrival window (seconds): means over time are taken over [first event, window], since
    #: the trace's long-running pods keep a few GPUs busy long after the last arrival.
    window: float = 0.0
    level_violations: int = 0
    #: Per placed gang (``g00012``): its members' nodes, in member order (what the bindings say).
    gang_nodes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    by_size: dict[int, dict[str, Any]] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        waits = metrics.queueing_stats(self.gang_waits)
        end = self.window
        inside = int(np.searchsorted(self.times, end, side="right"))  # samples in the arrival window
        return {
            "policy": self.policy,
            "seed": self.seed,
            "gangs": self.gangs,
            "placed": self.placed,
            "never_placed": self.gangs - self.placed,
            "in_one_rack_pct": _pct(self.in_rack, self.placed),
            "in_one_block_pct": _pct(self.in_block, self.placed),
            "gang_wait_s": {"mean": round(waits["mean"], 1), "p99": round(_p99(self.gang_waits), 1)},
            "pod_wait_mean_s": round(metrics.queueing_stats(self.pod_waits)["mean"], 1),
            "pods_unplaced": self.pods_unplaced,
            "alloc_mean": round(_time_mean(self.times, self.alloc, end), 3),
            "alloc_peak": round(float(self.alloc.max()), 3) if len(self.alloc) else 0.0,
            "free_racks_mean": round(_time_mean(self.times, self.free_racks.astype(np.float64), end), 2),
            "free_racks_min": int(self.free_racks[: max(inside, 1)].min()) if len(self.free_racks) else 0,
            "racks": self.racks,
            "level_violations": self.level_violations,
            "by_size": {str(k): v for k, v in sorted(self.by_size.items())},
            "wall_s": round(self.wall_s, 3),
        }


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 2) if whole else 0.0


def _p99(values: FloatArray) -> float:
    return float(np.percentile(values, 99)) if len(values) else 0.0


def _time_mean(times: FloatArray, values: FloatArray, end: float) -> float:
    """Time-weighted mean of the step function `values` over [times[0], end]."""
    if len(times) == 0:
        return 0.0
    if end <= times[0]:
        return float(values[0])
    edges = np.clip(np.append(times, np.inf), times[0], end)
    return float((values * np.diff(edges)).sum() / (end - times[0]))


class _TopologyReplay(_Replay):
    """`sim replay`'s loop over items = the trace's pods, then every gang's members; a gang's members
    arrive together and leave together (one duration). After every decision round it samples the
    whole racks free and notes where each newly placed gang went."""

    def __init__(
        self, scheduler: Scheduler, pods: PodTable, gangs: Gangs, config: TopologyConfig, *, aware: bool, index: Any
    ):
        super().__init__(scheduler, pods, None)
        self.gangs, self.config, self.aware, self.index = gangs, config, aware, index
        self.first_member: list[int] = []  # item of each gang's first member
        self.gang_of: list[int] = []  # gang of each gang member item (offset by len(pods))
        request, duration = list(self.request), list(self.duration)
        share = config.share_milli
        for g in range(len(gangs)):
            self.first_member.append(len(request))
            for w in gang_members(gangs, g, share, topology_aware=aware):
                self.keys[w.key] = len(request)
                request.append(share if gangs.fractional[g] else MILLI_PER_GPU)
                duration.append(float(gangs.duration[g]))
                self.gang_of.append(g)
        self.request = request
        self.duration = np.asarray(duration)
        self.delays = np.full(len(request), np.nan)
        self.evicted = np.zeros(len(request), dtype=np.int64)
        self.done = np.zeros(len(request), dtype=bool)
        self.view = scheduler.state.attach(GpuView())
        self.free_racks: list[int] = []
        self._members: dict[int, list[Workload]] = {}
        #: Per placed gang: (whether in one rack, in one block, whether its required level held).
        self.placements: dict[int, tuple[bool, bool, bool]] = {}
        self.nodes_of: dict[str, tuple[str, ...]] = {}

    def workload(self, i: int) -> Workload:
        if i < len(self.pods):
            return super().workload(i)
        g = self.gang_of[i - len(self.pods)]
        members = self._members.get(g)
        if members is None:  # built once per gang, when its first member arrives
            members = self._members[g] = gang_members(self.gangs, g, self.config.share_milli, topology_aware=self.aware)
        member = i - self.first_member[g]
        if member == len(members) - 1:
            del self._members[g]
        return members[member]

    def run(self, now: float, arrival: FloatArray) -> None:
        before = np.isnan(self.delays)
        super().run(now, arrival)
        fresh = before & ~np.isnan(self.delays)
        fresh[: len(self.pods)] = False
        for i in np.flatnonzero(fresh).tolist():
            g = self.gang_of[i - len(self.pods)]
            if i == self.first_member[g]:
                self._note(g)
        self.free_racks.append(self._whole_racks())

    def _note(self, g: int) -> None:
        """Where gang `g`'s members went: one rack? one block? its required level kept?"""
        state = self.scheduler.state
        members = int(self.gangs.members[g])
        keys = [f"{GANG_NAMESPACE}/g{g:05d}-{m}" for m in range(members)]
        nodes = tuple(state.bindings[k].node for k in keys)
        self.nodes_of[f"g{g:05d}"] = nodes
        rows = np.array([state.index[name] for name in nodes], dtype=np.int64)
        rack_level, block_level = 1, 0
        racks = set(self.index.ids[rack_level][rows].tolist())
        blocks = set(self.index.ids[block_level][rows].tolist())
        in_rack, in_block = len(racks) == 1, len(blocks) == 1
        kept = in_rack if self.gangs.level[g] == RACK_LABEL else in_block
        self.placements[g] = (in_rack, in_block, kept)

    def _whole_racks(self) -> int:
        """Racks with GPUs where every GPU of every node is wholly free."""
        n = self.scheduler.state.n
        used = self.view.count[:n] * MILLI_PER_GPU - self.view.free[:n].sum(axis=1)
        busy = self.index.sum((used > 0).astype(np.int64), 1)
        gpus = self.index.sum(self.view.count[:n].astype(np.int64), 1)
        return int(((busy == 0) & (gpus > 0)).sum())


def make_topology_scheduler(
    nodes: list[Node], policy: str, seed: int, node_policy: str, target_specs: list[dict[str, Any]]
) -> tuple[Scheduler, ClusterState]:
    """A fresh cluster of `nodes` and a Scheduler running `node_policy`'s profile, with the topology
    and (unless `policy` is unaware) `topologyPolicy: policy`."""
    state = ClusterState.from_nodes(nodes)
    profile = policy_profile(node_policy, seed, target_specs)
    if policy != UNAWARE:
        profile["topologyPolicy"] = policy
    return Scheduler(state, profile, registry=sim_registry(), topologies=[topology()]), state


def run_topology(
    table: NodeTable,
    pods: PodTable | None,
    policy: str,
    seed: int,
    config: TopologyConfig,
    *,
    progress: Progress | None = None,
) -> TopologyRun:
    """One policy x seed of the experiment (see the module docstring)."""
    problems = config.check()
    if problems:
        raise ValueError("; ".join(problems))
    policy = resolve_topology_policy(policy)
    started = time.perf_counter()
    background = background_pods(pods, config) if pods is not None else _no_pods()
    origin = trace_origin(pods) if pods is not None else 0.0
    gangs = make_gangs(config, seed, default_rack_limit(table, config))
    nodes = arrange(table, config.rack_size, config.block_size)
    target = metrics.target_workload(background).to_specs() if len(background) else []
    scheduler, state = make_topology_scheduler(nodes, policy, seed, config.node_policy, target)
    index = build_index(state, topology())
    loop = _TopologyReplay(scheduler, background, gangs, config, aware=policy != UNAWARE, index=index)
    arrival = np.concatenate(
        [(background.creation - origin) / config.time_scale, np.repeat(gangs.arrival, gangs.members)]
    ).astype(np.float64)
    times, alloc, _ = _step_through(loop, scheduler, arrival, table.gpu_capacity_milli, progress)
    waits = np.array([loop.delays[loop.first_member[g]] for g in sorted(loop.placements)])
    pod_delays = loop.delays[: len(background)]
    return TopologyRun(
        policy=policy,
        seed=seed,
        gangs=len(gangs),
        placed=len(loop.placements),
        in_rack=sum(p[0] for p in loop.placements.values()),
        in_block=sum(p[1] for p in loop.placements.values()),
        gang_waits=waits if len(waits) else np.zeros(0),
        pod_waits=pod_delays[~np.isnan(pod_delays)],
        pods_unplaced=int(np.isnan(pod_delays).sum()),
        times=np.asarray(times),
        alloc=np.asarray(alloc),
        free_racks=np.asarray(loop.free_racks, dtype=np.int64),
        racks=int((index.sum(state.attach(GpuView()).count[: state.n].astype(np.int64), 1) > 0).sum()),
        wall_s=time.perf_counter() - started,
        window=config.hours * 3600.0,
        level_violations=0 if policy == UNAWARE else sum(not p[2] for p in loop.placements.values()),
        gang_nodes=loop.nodes_of,
        by_size=_by_size(gangs, loop),
    )


def _by_size(gangs: Gangs, loop: _TopologyReplay) -> dict[int, dict[str, Any]]:
    """Per member count: gangs, placed, in one rack (%), mean wait (s)."""
    out: dict[int, dict[str, Any]] = {}
    for size in sorted(set(gangs.members.tolist())):
        mine = [g for g in range(len(gangs)) if gangs.members[g] == size]
        placed = [g for g in mine if g in loop.placements]
        waits = [loop.delays[loop.first_member[g]] for g in placed]
        out[size] = {
            "gangs": len(mine),
            "placed": len(placed),
            "in_one_rack_pct": _pct(sum(loop.placements[g][0] for g in placed), len(placed)),
            "wait_mean_s": round(float(np.mean(waits)), 1) if waits else 0.0,
        }
    return out


def _no_pods() -> PodTable:
    empty = np.zeros(0, dtype=np.int64)
    return PodTable((), empty, empty, empty, empty, (), (), empty, empty, empty, True)


def series(run: TopologyRun, points: int = 2000) -> dict[str, list[float]]:
    """The run's time series over the arrival window, down-sampled to about `points` samples."""
    inside = int(np.searchsorted(run.times, run.window, side="right"))
    step = max(1, inside // points)
    return {
        "t": [round(float(x), 1) for x in run.times[:inside:step]],
        "alloc": [round(float(x), 3) for x in run.alloc[:inside:step]],
        "free_racks": [int(x) for x in run.free_racks[:inside:step]],
    }
