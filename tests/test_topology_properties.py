"""Hypothesis: topology gangs on random clusters of blocks and racks.

Whatever the cluster and the gangs: a required level is never violated (all members' nodes share
one domain of it), every slice sits in one domain of its level, a gang is placed whole or not at
all, and nothing is over-allocated (the state's invariants hold after every decision).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from builders import make_node, make_workload
from finesched.model.binding import Binding
from finesched.model.node import Node
from finesched.model.topology import BLOCK_LABEL, HOSTNAME_LABEL, RACK_LABEL
from finesched.model.workload import Workload
from finesched.sched.diagnosis import FitError
from test_topology_gangs import placed_node, scheduler

LEVELS = (BLOCK_LABEL, RACK_LABEL, HOSTNAME_LABEL)


@st.composite
def clusters(draw: st.DrawFn) -> list[Node]:
    nodes = []
    for b in range(draw(st.integers(1, 2))):
        for r in range(draw(st.integers(1, 3))):
            for n in range(draw(st.integers(1, 3))):
                name = f"b{b}-r{r}-n{n}"
                builder = make_node(name).cpu(str(draw(st.integers(1, 8)))).memory("16Gi")
                if draw(st.booleans()):
                    builder = builder.gpus(draw(st.integers(1, 2)))
                nodes.append(placed_node(name, builder))
    return nodes


@st.composite
def gangs(draw: st.DrawFn, name: str) -> list[Workload]:
    size = draw(st.integers(1, 6))
    level = draw(st.sampled_from(LEVELS[:2]))
    topology: dict[str, object] = {"name": "dc", draw(st.sampled_from(["required", "preferred"])): level}
    if draw(st.booleans()):
        divisors = [d for d in range(1, size + 1) if size % d == 0]
        finer = LEVELS[LEVELS.index(level) :]  # the slice level: the gang's or finer
        topology["slice"] = {"size": draw(st.sampled_from(divisors)), "required": draw(st.sampled_from(finer))}
    requests: dict[str, str] = {"cpu": str(draw(st.integers(1, 3)))}
    gpu = draw(st.sampled_from([None, "nvidia.com/gpu", "share"]))
    if gpu == "nvidia.com/gpu":
        requests[gpu] = "1"
    elif gpu == "share":
        requests["koordinator.sh/gpu-core"] = "50"
        requests["koordinator.sh/gpu-memory-ratio"] = "50"
    members = []
    for i in range(size):
        b = make_workload(f"{name}-{i}")
        for resource, amount in requests.items():
            b = b.request(resource, amount)
        members.append(b.set(gang={"name": name, "minMember": size, "topology": topology}).obj())
    return members


def domain(node: str, depth: int) -> tuple[str, ...]:
    return tuple(node.split("-")[: depth + 1])


@settings(max_examples=60, deadline=None)
@given(nodes=clusters(), data=st.data(), policy=st.sampled_from(["BestFit", "KeepDomainsWhole"]))
def test_topology_gangs_respect_their_levels_all_or_nothing(
    nodes: list[Node], data: st.DataObject, policy: str
) -> None:
    profile = {"name": "p", "plugins": [{"name": "ResourcesFit"}, {"name": "DeviceShare"}, {"name": "LeastRequested"}]}
    s = scheduler(nodes, {**profile, "topologyPolicy": policy})
    for g in range(data.draw(st.integers(1, 5))):
        members = data.draw(gangs(f"g{g}"))
        ask = members[0].gang.topology  # type: ignore[union-attr]
        before = dict(s.state.bindings)
        try:
            bound = s.schedule_gang(members)
        except FitError:
            assert dict(s.state.bindings) == before  # none placed, nothing else changed
            s.state.check_invariants()
            continue
        assert len(bound) == len(members) and all(isinstance(b, Binding) for b in bound)
        assert [b.workload for b in bound] == [m.key for m in members]  # member index order
        if ask.required is not None:
            depth = LEVELS.index(ask.required)
            assert len({domain(b.node, depth) for b in bound}) == 1
        if ask.slice is not None:
            depth, size = LEVELS.index(ask.slice.required), ask.slice.size
            for start in range(0, len(bound), size):
                assert len({domain(b.node, depth) for b in bound[start : start + size]}) == 1
        s.state.check_invariants()
