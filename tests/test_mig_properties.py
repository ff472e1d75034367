"""Safety properties of MIG scheduling (hypothesis), on random nodes of every included product:

* no memory slice is ever held twice and every held instance is a placement its product allows,
  beside the card's existing instances (the state invariants, `MIGSlices.violations`);
* rebuilding the state from nodes and bindings gives the same cards;
* the filter passes a node exactly when the exact choice finds a layout there.
"""

from __future__ import annotations

import contextlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from finesched.model.mig import PRODUCTS, mig_resource
from finesched.model.node import Node
from finesched.model.workload import Workload
from finesched.plugins.deviceshare import DeviceShare
from finesched.plugins.deviceshare.mig import MIGRequest, choose_mig, mig_mask
from finesched.sched.diagnosis import FitError
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState
from finesched.state.invariants import check
from finesched.state.mig_slices import MIGSlices, attach_mig_slices

PRODUCT_NAMES = sorted(PRODUCTS)
PROFILES = sorted({p.name for g in PRODUCTS.values() for p in g.profiles})


@st.composite
def instances(draw, product: str) -> list[dict[str, object]]:
    """A valid set of existing instances: random placements kept while they fit together."""
    g = PRODUCTS[product]
    chosen: list[tuple[str, int]] = []
    for j in draw(st.lists(st.integers(0, len(g.placements) - 1), max_size=3)):
        k, start = g.placements[j]
        trial = [*chosen, (g.profiles[k].name, start)]
        if not g.problems(trial):
            chosen = trial
    return [{"profile": p, "start": s, "uuid": f"MIG-{p}-{s}"} for p, s in chosen]


@st.composite
def mig_nodes(draw, name: str) -> Node:
    devices = []
    for m in range(draw(st.integers(1, 3))):
        product = draw(st.sampled_from(PRODUCT_NAMES))
        mode = draw(st.sampled_from(["static", "dynamic", "dynamic"]))
        devices.append(
            {
                "type": "gpu",
                "minor": m,
                "health": draw(st.sampled_from([True, True, True, True, True, False])),
                "mig": {"product": product, "mode": mode, "instances": draw(instances(product))},
            }
        )
    return Node.model_validate({"name": name, "allocatable": {"cpu": "64", "memory": "64Gi"}, "devices": devices})


REQUESTS = st.lists(
    st.tuples(st.sampled_from(PROFILES), st.integers(1, 2)), min_size=1, max_size=2, unique_by=lambda x: x[0]
)


class MIGMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state: ClusterState
        self.scheduler: Scheduler
        self.count = 0

    @initialize(nodes=st.lists(st.integers(0, 10**6), min_size=1, max_size=3, unique=True), data=st.data())
    def setup(self, nodes: list[int], data: st.DataObject) -> None:
        self.state = ClusterState.from_nodes([data.draw(mig_nodes(f"n{k}")) for k in nodes])
        self.scheduler = Scheduler(self.state)

    @rule(data=st.data())
    def schedule(self, data: st.DataObject) -> None:
        """A request for profiles the cluster's products have (most of the time) or any profile."""
        here = sorted({p.name for n in self.state.nodes for d in n.devices if d.mig for p in d.mig.geometry.profiles})
        names = st.sampled_from(here) if data.draw(st.integers(0, 9)) else st.sampled_from(PROFILES)
        size = 2 if data.draw(st.integers(0, 3)) == 0 else 1
        counts = st.sampled_from([1, 1, 2])
        wants = data.draw(st.lists(st.tuples(names, counts), min_size=size, max_size=size, unique_by=lambda x: x[0]))
        self.count += 1
        requests = {"cpu": "1", **{mig_resource(p): n for p, n in wants}}
        workload = Workload.model_validate({"name": f"w{self.count}", "requests": requests})
        with contextlib.suppress(FitError):
            self.scheduler.schedule_one(workload)

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        if self.state.bindings:
            key = data.draw(st.sampled_from(sorted(self.state.bindings)))
            self.scheduler.release(key)

    @rule(data=st.data())
    def flip_health(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, self.state.n - 1))
        node = self.state.nodes[i]
        m = data.draw(st.integers(0, len(node.devices) - 1))
        devices = [d.model_copy(update={"health": not d.health}) if k == m else d for k, d in enumerate(node.devices)]
        self.state.update_node(node.model_copy(update={"devices": tuple(devices)}))

    @invariant()
    def no_slice_twice_and_every_placement_allowed(self) -> None:
        assert check(self.state) == []

    @invariant()
    def rebuild_gives_the_same_cards(self) -> None:
        fresh = ClusterState.from_nodes(list(self.state.nodes))
        for b in self.state.bindings.values():
            fresh.assume(b)
        mine = attach_mig_slices(self.state)
        rebuilt = attach_mig_slices(fresh)
        assert [mine.cards[i] for i in range(self.state.n)] == [rebuilt.cards[i] for i in range(fresh.n)]
        assert np.array_equal(mine.fit[: self.state.n], rebuilt.fit[: fresh.n])


TestMIGMachine = MIGMachine.TestCase
TestMIGMachine.settings = settings(max_examples=80, stateful_step_count=15, deadline=None)


@given(node=mig_nodes("n"), wants=REQUESTS)
@settings(max_examples=150, deadline=None)
def test_filter_passes_exactly_where_the_exact_choice_finds_a_layout(node: Node, wants: list[tuple[str, int]]) -> None:
    state = ClusterState.from_nodes([node])
    DeviceShare().attach(state)
    slices: MIGSlices = attach_mig_slices(state)
    request = MIGRequest(tuple(sorted(wants)))
    passed = bool(mig_mask(slices, request, 1, None)[0])
    assert passed == (choose_mig(slices.cards[0], request) is not None)
    assert passed == (choose_mig(slices.cards[0], request, first_fit=False) is not None)
