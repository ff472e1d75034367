"""kube-scheduler's own preemption tests, translated into finesched manifests.

Source: kubernetes/kubernetes pkg/scheduler/framework/plugins/defaultpreemption/default_preemption_test.go,
tables `TestSelectBestCandidate` (the node pickOneNodeForPreemption picks) and `TestDryRunPreemption`
(the victims SelectVictimsOnNode picks on each node, with NumPDBViolations). Their fixtures, kept:

* every node has capacity ``veryLargeRes`` = 500m cpu, 500 (bytes of) memory;
* pod sizes small = 100m/100, medium = 200m/200, large = 300m/300, veryLarge = 500m/500;
* priorities neg = -100, low = 0, mid = 100, high = 1000, veryHigh = 10000;
* a PodDisruptionBudget with DisruptionsAllowed A over N matching pods is a finesched
  ``disruptionBudget`` with minAvailable N - A and the same label selector;
* a pod's StartTime is its start order here (finesched orders victims by when they were bound), so
  pods are bound in StartTime order, ties in the order the Go test lists them.

Victims are pinned to their node with a node selector. A DryRun "candidate on node X" is asked by
pinning the preemptor to X: finesched's answer there is that node's victims (the other nodes are
unresolvable for it, so they are not tried).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from builders import make_node, make_workload
from finesched.plugins.preemption_index import ANNOTATION_PREEMPTION
from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import FilterResult, NodeBatch
from finesched.sched.registry import default_registry, no_args
from finesched.sched.request import ScheduleRequest
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

NEG, LOW, MID, HIGH, VERY_HIGH = -100, 0, 100, 1000, 10_000
SMALL, MEDIUM, LARGE, VERY_LARGE = 100, 200, 300, 500  # millicores; the same number of bytes of memory


@dataclass(frozen=True)
class Pod:
    name: str
    node: str
    priority: int
    size: int
    labels: tuple[tuple[str, str], ...] = ()
    budget: tuple[int, str] | None = None  # (minAvailable, app label) of a budget this pod declares


def pod(
    name: str, node: str, priority: int, size: int, app: str | None = None, min_available: int | None = None
) -> Pod:
    labels = (("app", app),) if app else ()
    budget = (min_available, app) if min_available is not None and app else None
    return Pod(name, node, priority, size, labels, budget)


def cluster(nodes: list[str], pods: list[Pod]) -> Scheduler:
    built = [make_node(n).cpu("500m").memory("500").label("node", n).obj() for n in nodes]
    s = Scheduler(ClusterState.from_nodes(built))
    for p in pods:  # listed in StartTime order
        w = make_workload(p.name).req(cpu=f"{p.size}m", memory=str(p.size)).priority(p.priority)
        fields: dict[str, object] = {"labels": dict(p.labels)}
        if p.budget is not None:
            fields["disruptionBudget"] = {"minAvailable": p.budget[0], "selector": {"app": p.budget[1]}}
        s.schedule_one(w.selector(node=p.node).set(**fields).obj())
    return s


def preemptor(priority: int, size: int, node: str | None = None):
    w = make_workload("p").req(cpu=f"{size}m", memory=str(size)).priority(priority)
    return (w.selector(node=node) if node else w).obj()


# TestSelectBestCandidate ----------------------------------------------------------------------------------------
SELECT_BEST = [
    # "a pod that fits on both nodes when lower priority pods are preempted": each node holds one mid large pod
    # (300 of 500 used, 200 free < 300): evicting it is the only way, on either node; every criterion ties
    # (k8s: "any of node1, node2"). finesched breaks the start-time tie: p2 started later -> node2.
    pytest.param(
        ["node1", "node2"],
        [pod("p1", "node1", MID, LARGE), pod("p2", "node2", MID, LARGE)],
        preemptor(HIGH, LARGE),
        {"node1", "node2"},
        {"node1": ["p1"], "node2": ["p2"]},
        id="fits-on-both-nodes",
    ),
    # "node with min highest priority pod is picked": veryLarge needs a whole node, so every pod there goes.
    # Highest victim priority: node1 mid, node2 mid, node3 low -> node3.
    pytest.param(
        ["node1", "node2", "node3"],
        [
            pod("p1.1", "node1", MID, MEDIUM),
            pod("p1.2", "node1", MID, LARGE),
            pod("p2.1", "node2", MID, MEDIUM),
            pod("p2.2", "node2", LOW, MEDIUM),
            pod("p3.1", "node3", LOW, MEDIUM),
            pod("p3.2", "node3", LOW, MEDIUM),
        ],
        preemptor(HIGH, VERY_LARGE),
        {"node3"},
        {"node3": ["p3.1", "p3.2"]},
        id="min-highest-priority",
    ),
    # "when highest priorities are the same, minimum sum of priorities is picked": all tops are mid; sums
    # (each + 2^31): node1 2*2^31 + 200, node2 2*2^31 + 100, node3 2*2^31 + 200 -> node2.
    pytest.param(
        ["node1", "node2", "node3"],
        [
            pod("p1.1", "node1", MID, MEDIUM),
            pod("p1.2", "node1", MID, LARGE),
            pod("p2.1", "node2", MID, LARGE),
            pod("p2.2", "node2", LOW, MEDIUM),
            pod("p3.1", "node3", MID, MEDIUM),
            pod("p3.2", "node3", MID, MEDIUM),
        ],
        preemptor(HIGH, VERY_LARGE),
        {"node2"},
        {"node2": ["p2.1", "p2.2"]},
        id="min-sum-of-priorities",
    ),
    # "when highest priority and sum are the same, minimum number of pods is picked": raw sums are all 0
    # (mid + neg + mid + neg, mid + neg, mid + neg + low); offset sums 4*2^31, 2*2^31, 3*2^31 -> node2
    # (the raw-sum tie would have gone to "fewest pods": node2 as well).
    pytest.param(
        ["node1", "node2", "node3"],
        [
            pod("p1.1", "node1", MID, SMALL),
            pod("p1.2", "node1", NEG, SMALL),
            pod("p1.3", "node1", MID, SMALL),
            pod("p1.4", "node1", NEG, SMALL),
            pod("p2.1", "node2", MID, LARGE),
            pod("p2.2", "node2", NEG, MEDIUM),
            pod("p3.1", "node3", MID, MEDIUM),
            pod("p3.2", "node3", NEG, SMALL),
            pod("p3.3", "node3", LOW, SMALL),
        ],
        preemptor(HIGH, VERY_LARGE),
        {"node2"},
        {"node2": ["p2.1", "p2.2"]},
        id="min-number-of-pods",
    ),
    # "sum of adjusted priorities is considered" (pickOneNodeForPreemption adds MaxInt32+1 to each priority):
    # raw sums node1 mid+neg+neg = -100, node2 mid+neg = 0, node3 mid+neg+low = 0 would pick node1; offset sums
    # node1 3*2^31 - 100, node2 2*2^31, node3 3*2^31 -> node2.
    pytest.param(
        ["node1", "node2", "node3"],
        [
            pod("p1.1", "node1", MID, SMALL),
            pod("p1.2", "node1", NEG, SMALL),
            pod("p1.3", "node1", NEG, SMALL),
            pod("p2.1", "node2", MID, LARGE),
            pod("p2.2", "node2", NEG, MEDIUM),
            pod("p3.1", "node3", MID, MEDIUM),
            pod("p3.2", "node3", NEG, SMALL),
            pod("p3.3", "node3", LOW, SMALL),
        ],
        preemptor(HIGH, VERY_LARGE),
        {"node2"},
        {"node2": ["p2.1", "p2.2"]},
        id="sum-of-adjusted-priorities",
    ),
    # "non-overlapping lowest high priority, sum priorities, and number of pods" (preemptor veryHigh): tops are
    # node1 mid, node2 high, node3 mid, node4 mid; offset sums node1 3*2^31 + 100, node3 4*2^31 + 100,
    # node4 4*2^31 + 200 -> node1. Adapted: the Go test gives node3 200+100+100+200 = 600 on a 500 node (its
    # snapshot does not check fit); here p3.4 is small, so node3 holds 500 — still 4 victims, top mid.
    pytest.param(
        ["node1", "node2", "node3", "node4"],
        [
            pod("p1.1", "node1", MID, SMALL),
            pod("p1.2", "node1", LOW, SMALL),
            pod("p1.3", "node1", LOW, SMALL),
            pod("p2.1", "node2", HIGH, LARGE),
            pod("p3.1", "node3", MID, MEDIUM),
            pod("p3.2", "node3", LOW, SMALL),
            pod("p3.3", "node3", LOW, SMALL),
            pod("p3.4", "node3", LOW, SMALL),
            pod("p4.1", "node4", MID, MEDIUM),
            pod("p4.2", "node4", MID, SMALL),
            pod("p4.3", "node4", MID, SMALL),
            pod("p4.4", "node4", NEG, SMALL),
        ],
        preemptor(VERY_HIGH, VERY_LARGE),
        {"node1"},
        {"node1": ["p1.1", "p1.2", "p1.3"]},
        id="non-overlapping-criteria",
    ),
    # "same priority, same number of victims, different start time for each node's pod": start times
    # node1 2, node2 3, node3 1 (bound in that order: node3, node1, node2); everything else ties; the latest
    # earliest start among the highest-priority victims wins -> node2.
    pytest.param(
        ["node1", "node2", "node3"],
        [
            pod("p3.1", "node3", MID, MEDIUM),
            pod("p3.2", "node3", MID, MEDIUM),
            pod("p1.1", "node1", MID, MEDIUM),
            pod("p1.2", "node1", MID, MEDIUM),
            pod("p2.1", "node2", MID, MEDIUM),
            pod("p2.2", "node2", MID, MEDIUM),
        ],
        preemptor(HIGH, VERY_LARGE),
        {"node2"},
        {"node2": ["p2.1", "p2.2"]},
        id="start-time-per-node",
    ),
    # "same priority, same number of victims, different start time for all pods": node1 {4, 2}, node2 {5, 1},
    # node3 {3, 6}; earliest per node 2, 1, 3 -> node3 (the latest earliest start).
    pytest.param(
        ["node1", "node2", "node3"],
        [
            pod("p2.2", "node2", MID, MEDIUM),  # t1
            pod("p1.2", "node1", MID, MEDIUM),  # t2
            pod("p3.1", "node3", MID, MEDIUM),  # t3
            pod("p1.1", "node1", MID, MEDIUM),  # t4
            pod("p2.1", "node2", MID, MEDIUM),  # t5
            pod("p3.2", "node3", MID, MEDIUM),  # t6
        ],
        preemptor(HIGH, VERY_LARGE),
        {"node3"},
        {"node3": ["p3.1", "p3.2"]},
        id="start-time-all-pods",
    ),
    # "different priority, same number of victims, different start time for all pods": each node has one low and
    # one mid victim (tops, sums and counts tie); earliest start among the *mid* victims: node1 2, node2 6,
    # node3 5 -> node2.
    pytest.param(
        ["node1", "node2", "node3"],
        [
            pod("p2.2", "node2", LOW, MEDIUM),  # t1
            pod("p1.2", "node1", MID, MEDIUM),  # t2
            pod("p3.1", "node3", LOW, MEDIUM),  # t3
            pod("p1.1", "node1", LOW, MEDIUM),  # t4
            pod("p3.2", "node3", MID, MEDIUM),  # t5
            pod("p2.1", "node2", MID, MEDIUM),  # t6
        ],
        preemptor(HIGH, VERY_LARGE),
        {"node2"},
        {"node2": ["p2.1", "p2.2"]},
        id="start-time-of-highest-priority-victims",
    ),
]


@pytest.mark.parametrize(("nodes", "pods", "workload", "any_of", "victims"), SELECT_BEST)
def test_select_best_candidate(nodes, pods, workload, any_of, victims) -> None:
    s = cluster(nodes, pods)
    p, why = s.find_preemption(workload)
    assert p is not None, why
    assert p.node in any_of
    assert sorted(v.split("/")[1] for v in p.victim_keys) == victims[p.node]
    s.apply_preemption(p)
    s.state.check_invariants()


# TestDryRunPreemption ---------------------------------------------------------------------------------------
# want: {node: (victims, NumPDBViolations)}; a node absent from `want` is no candidate.
DRY_RUN = [
    # "a pod that fits on both nodes when lower priority pods are preempted": large into 200 free -> each
    # node's mid large pod goes.
    pytest.param(
        ["node1", "node2"],
        [pod("p1", "node1", MID, LARGE), pod("p2", "node2", MID, LARGE)],
        (HIGH, LARGE),
        {"node1": (["p1"], 0), "node2": (["p2"], 0)},
        id="fits-on-both-nodes",
    ),
    # "a pod that would fit on the nodes, but other pods running are higher priority, no preemption would
    # happen": the preemptor is low, the pods mid: no victim anywhere.
    pytest.param(
        ["node1", "node2"],
        [pod("p1", "node1", MID, LARGE), pod("p2", "node2", MID, LARGE)],
        (LOW, LARGE),
        {},
        id="higher-priority-pods-stay",
    ),
    # "medium priority pod is preempted, but lower priority one stays as it is small": node1 holds p1.1 (low
    # small) and p1.2 (mid large). All out (500 free); reprieve p1.2 (mid first): 200 free < 300 -> victim;
    # p1.1 back: 400 - 100 = 400 free >= 300 -> stays.
    pytest.param(
        ["node1", "node2"],
        [pod("p1.1", "node1", LOW, SMALL), pod("p1.2", "node1", MID, LARGE), pod("p2", "node2", MID, LARGE)],
        (HIGH, LARGE),
        {"node1": (["p1.2"], 0), "node2": (["p2"], 0)},
        id="small-lower-priority-stays",
    ),
    # "mixed priority pods are preempted": node1 holds p1.1 mid small, p1.2 low small, p1.3 mid medium, p1.4
    # high small (equal to the preemptor: not eligible). All eligible out: 400 free. Reprieve mid first,
    # older first: p1.1 back -> 300 >= 300 stays; p1.3 back -> 100 < 300 victim; p1.2 back -> 200 < 300
    # victim. node2's only pod is high: no candidate.
    pytest.param(
        ["node1", "node2"],
        [
            pod("p1.1", "node1", MID, SMALL),
            pod("p1.2", "node1", LOW, SMALL),
            pod("p1.3", "node1", MID, MEDIUM),
            pod("p1.4", "node1", HIGH, SMALL),
            pod("p2", "node2", HIGH, LARGE),
        ],
        (HIGH, LARGE),
        {"node1": (["p1.2", "p1.3"], 0)},
        id="mixed-priorities",
    ),
    # "mixed priority pods are preempted, pick later StartTime one when priorities are equal": StartTimes
    # p2 1, p1.4 2, p1.3 3, p1.2 4, p1.1 5. Reprieve p1.3 (mid) -> 200 < 300 victim; then the lows, older
    # first: p1.2 back -> 300 stays; p1.1 back -> 200 victim. Victims p1.1 (the later one) and p1.3.
    pytest.param(
        ["node1", "node2"],
        [
            pod("p2", "node2", HIGH, LARGE),
            pod("p1.4", "node1", HIGH, SMALL),
            pod("p1.3", "node1", MID, MEDIUM),
            pod("p1.2", "node1", LOW, SMALL),
            pod("p1.1", "node1", LOW, SMALL),
        ],
        (HIGH, LARGE),
        {"node1": (["p1.1", "p1.3"], 0)},
        id="later-start-time-goes",
    ),
    # "preemption with violation of same pdb": p1.1 and p1.2 (app=foo, mid medium), DisruptionsAllowed 1
    # (minAvailable 1 of 2). filterPodsWithPDBViolation in importance order: p1.1 takes the one allowed
    # disruption, p1.2 finds none left -> violating. veryLarge needs both out -> NumPDBViolations 1.
    pytest.param(
        ["node1"],
        [pod("p1.1", "node1", MID, MEDIUM, "foo", 1), pod("p1.2", "node1", MID, MEDIUM, "foo", 1)],
        (HIGH, VERY_LARGE),
        {"node1": (["p1.1", "p1.2"], 1)},
        id="violation-of-same-pdb",
    ),
    # "preemption looks past numCandidates until a non-PDB violating node is found": p1, p2, p5 are app=foo
    # with DisruptionsAllowed 0 (minAvailable 3 of 3): evicting any one of them violates (1 each); p3, p4
    # have no budget.
    pytest.param(
        ["node1", "node2", "node3", "node4", "node5"],
        [
            pod("p1", "node1", MID, LARGE, "foo", 3),
            pod("p2", "node2", MID, LARGE, "foo", 3),
            pod("p3", "node3", MID, LARGE),
            pod("p4", "node4", MID, LARGE),
            pod("p5", "node5", MID, LARGE, "foo", 3),
        ],
        (HIGH, LARGE),
        {
            "node1": (["p1"], 1),
            "node2": (["p2"], 1),
            "node3": (["p3"], 0),
            "node4": (["p4"], 0),
            "node5": (["p5"], 1),
        },
        id="pdb-violating-candidates",
    ),
]


@pytest.mark.parametrize(("nodes", "pods", "ask", "want"), DRY_RUN)
def test_dry_run_preemption(nodes, pods, ask, want) -> None:
    s = cluster(nodes, pods)
    got = {}
    for node in nodes:
        p, _ = s.find_preemption(preemptor(*ask, node=node))
        if p is not None:
            assert p.node == node
            got[node] = (sorted(v.split("/")[1] for v in p.victim_keys), p.violations)
    assert got == want
    # SelectCandidate over all of them: the fewest violations first (for the budget case: node3 or node4,
    # never a node whose eviction breaks the budget, as kube-scheduler's pick from node1/node3/node5).
    best, _ = s.find_preemption(preemptor(*ask))
    if want:
        assert best is not None and best.violations == min(v for _, v in want.values())
        assert (sorted(v.split("/")[1] for v in best.victim_keys), best.violations) == want[best.node]
    else:
        assert best is None


class HostAntiAffinity:
    """A test filter standing in for kube-scheduler's InterPodAffinity (required anti-affinity of existing
    pods, topology key hostname): a node is rejected while a workload there carries label
    ``anti-affinity: K`` and the preemptor has a label K. The fast victim model knows nothing of it."""

    NAME = "HostAntiAffinity"

    def filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> FilterResult:
        state, keys = nodes.state, set(request.workload.labels)
        mask = np.ones(nodes.n, dtype=bool)
        for k in range(nodes.n):
            for binding in state.bindings_on(state.names[nodes.node(k)]):
                text = binding.annotations.get(ANNOTATION_PREEMPTION)
                labels = json.loads(text).get("labels", {}) if text else {}
                mask[k] &= labels.get("anti-affinity") not in keys
        return FilterResult(mask)


def test_dry_run_pod_with_anti_affinity_is_preempted() -> None:
    # TestDryRunPreemption "pod with anti-affinity is preempted": node1 holds p1.1 (low, small, label foo,
    # anti-affinity to foo), p1.2 (mid, small), p1.3 (high, small); node2 holds p2 (high, small). The preemptor
    # (high, small, label foo) fits by resources everywhere; only p1.1's anti-affinity keeps it off node1.
    # Model plan: evict p1.1 and p1.2, reprieve both (resources fit) -> nobody evicted, which the filter
    # refused -> the exact path: p1.2 back passes the real filter, p1.1 back does not -> victims [p1.1].
    # node2: its only pod is high (not eligible) -> no candidate.
    profile = {
        "plugins": [{"name": n} for n in ("NodeSelector", "ResourcesFit", "HostAntiAffinity", "DefaultPreemption")]
    }
    registry = default_registry().with_plugins({"HostAntiAffinity": no_args(HostAntiAffinity)})
    nodes = [make_node(n).cpu("500m").memory("500").label("node", n).obj() for n in ("node1", "node2")]
    s = Scheduler(ClusterState.from_nodes(nodes), profile, registry=registry)
    for name, node, priority, labels in [
        ("p1.1", "node1", LOW, {"foo": "", "anti-affinity": "foo"}),
        ("p1.2", "node1", MID, {}),
        ("p1.3", "node1", HIGH, {}),
        ("p2", "node2", HIGH, {}),
    ]:
        w = make_workload(name).req(cpu=f"{SMALL}m", memory=str(SMALL)).priority(priority).selector(node=node)
        s.schedule_one(w.set(labels=labels).obj())
    ask = make_workload("p").req(cpu=f"{SMALL}m", memory=str(SMALL)).priority(HIGH).set(labels={"foo": ""})
    p, why = s.find_preemption(ask.selector(node="node1").obj())
    assert p is not None, why
    assert (p.node, p.victim_keys) == ("node1", ["default/p1.1"])
    p2, _ = s.find_preemption(ask.selector(node="node2").obj())
    assert p2 is None
