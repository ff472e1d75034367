"""Topology-aware gangs: the worked examples of the peers' documentation, as table tests.

Each case cites its source (see /work/shared/reference/TOPOLOGY.md for the facts): Kueue's TAS KEP
(`kubernetes-sigs/kueue` `keps/2724-topology-aware-scheduling/README.md`), Kubernetes' v1.36
PodGroup topology test (`kubernetes/kubernetes`
`test/integration/scheduler/podgroup/topology_aware_scheduling/tas_test.go`) and KAI-Scheduler's
topology documentation (`NVIDIA/KAI-Scheduler` `docs/topology/README.md`). Node names follow
tests/test_topology_gangs.py: ``b1-r2-n3`` is node n3 of rack r2 of block b1.
"""

from __future__ import annotations

from collections import Counter

import pytest

from builders import make_node, make_workload
from finesched.model.topology import BLOCK_LABEL, HOSTNAME_LABEL, RACK_LABEL
from finesched.sched.diagnosis import FitError
from test_topology_gangs import gang, placed_node, racks_of, scheduler


def cpu_node(name: str, cpus: int):  # type: ignore[no-untyped-def]
    return placed_node(name, make_node(name).cpu(str(cpus)).memory("64Gi"))


def per_node(bindings) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return dict(Counter(b.node for b in bindings))


@pytest.mark.parametrize(
    ("free", "members", "want"),
    [
        # Kueue KEP 2724, BestFit worked example: nodes with room for 3, 3, 2 and 1 pods, 7 pods
        # -> 3, 3, 1 (the last node chosen by tightest fit). Here: slices of 1 on hostname inside
        # one required rack, so the descent over nodes is Kueue's.
        pytest.param((3, 3, 2, 1), 7, {"n1": 3, "n2": 3, "n4": 1}, id="kueue-kep-bestfit-3-3-2-1"),
        # the same nodes, 2 pods: one node holds them; the tightest that does is the 2-pod node.
        pytest.param((3, 3, 2, 1), 2, {"n3": 2}, id="kueue-tightest-node"),
    ],
)
def test_kueue_bestfit_descent_over_nodes(free: tuple[int, ...], members: int, want: dict[str, int]) -> None:
    s = scheduler([cpu_node(f"b1-r1-n{i + 1}", c) for i, c in enumerate(free)])
    bound = s.schedule_gang(gang("g", members, required=RACK_LABEL, slice_={"size": 1, "required": HOSTNAME_LABEL}))
    assert {k.split("-")[2]: v for k, v in per_node(bound).items()} == want
    # consecutive members share a node (slices of 1 are filled node by node, in member order)
    nodes = [b.node for b in bound]
    assert nodes == sorted(nodes, key=nodes.index)
    s.state.check_invariants()


def test_kueue_kep_slice_example() -> None:
    """Kueue KEP 2724: slice size 2 on nodes with room for 6, 5, 4, 3, 2 pods, 12 pods -> 6, -, 4, -, 2
    (nodes sorted by slices held, then fewest pods: 6 (3 slices), 4 (2), 5 (2), 2 (1), 3 (1);
    filled greedily, the last by tightest fit)."""
    s = scheduler([cpu_node(f"b1-r1-n{i + 1}", c) for i, c in enumerate((6, 5, 4, 3, 2))])
    bound = s.schedule_gang(gang("g", 12, required=RACK_LABEL, slice_={"size": 2, "required": HOSTNAME_LABEL}))
    assert per_node(bound) == {"b1-r1-n1": 6, "b1-r1-n3": 4, "b1-r1-n5": 2}
    assert all(bound[i].node == bound[i + 1].node for i in range(0, 12, 2))  # every slice on one node


def test_kubernetes_tas_test_most_allocated_rack() -> None:
    """Kubernetes v1.36 tas_test.go: racks of 2-CPU nodes, 3 pods of 1 CPU. rack1: 2 nodes, none used
    ((0+3)/4 = 0.75); rack2: 3 nodes, 2 CPUs used ((2+3)/6 = 0.83); rack3: 3 nodes, 1 CPU used
    ((1+3)/6 = 0.67) -> rack2. Under BestFit rack1 and rack2 tie (room for 4 each; rack3 has 5), and
    the most allocated breaks the tie: rack2, as Kubernetes chooses."""
    nodes = [cpu_node("b1-rack1-n1", 2), cpu_node("b1-rack1-n2", 2)]
    nodes += [cpu_node(f"b1-rack{r}-n{i}", 2) for r in (2, 3) for i in (1, 2, 3)]
    s = scheduler(nodes)
    for name, node in (("u1", "b1-rack2-n1"), ("u2", "b1-rack2-n2"), ("u3", "b1-rack3-n1")):
        s.schedule_one(make_workload(name).req(cpu="1").selector(**{HOSTNAME_LABEL: node}).obj())
    assert racks_of(s.schedule_gang(gang("g", 3, required=RACK_LABEL))) == {"b1-rack2"}


def test_kai_scheduler_packs_into_the_domain_with_least_room() -> None:
    """KAI-Scheduler docs/topology: among domains that hold the job, the one with the least available
    resource relative to the request: zone A with 5 free GPUs beats zone B with 6 for 3 one-GPU pods."""
    a = [placed_node("za-r1-n1", make_node("za-r1-n1").cpu("32").memory("64Gi").gpus(5))]
    b = [placed_node("zb-r1-n1", make_node("zb-r1-n1").cpu("32").memory("64Gi").gpus(6))]
    s = scheduler(a + b)
    bound = s.schedule_gang(gang("g", 3, required=BLOCK_LABEL, requests={"cpu": "1", "nvidia.com/gpu": "1"}))
    assert {x.node for x in bound} == {"za-r1-n1"}


def test_kueue_required_fails_rather_than_spills_and_preferred_spills() -> None:
    """Kueue TAS docs: podset-required-topology waits when no single domain fits; preferred tries each
    higher level in turn, then admits spread over several domains."""
    s = scheduler([cpu_node("b1-r1-n1", 2), cpu_node("b2-r1-n1", 2)])
    with pytest.raises(FitError, match="holds 2 of 3 members"):
        s.schedule_gang(gang("req", 3, required=BLOCK_LABEL))
    assert len(s.schedule_gang(gang("pref", 3, preferred=BLOCK_LABEL))) == 3
