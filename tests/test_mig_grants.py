"""A grant is what was asked for: MIG requests and releases on several identical cards (hypothesis),
the two reported cases where a memoized device offer answered another request, the same check for
the other memoized offers (fractional GPU shares, partition tables), and `finesched plan` showing
the MIG grant in JSON, YAML and the table.

The placement rules are checked against the tables of ../shared/reference/MIG.md written out here
(`RULES`), not against the code's own product tables (model/mig.py), so a wrong table would show.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from typer.testing import CliRunner

from finesched.cli import app
from finesched.model.binding import Binding
from finesched.model.mig import mig_resource
from finesched.model.node import Node
from finesched.model.workload import Workload
from finesched.sched.diagnosis import FitError
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState
from finesched.state.invariants import check

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = str(ROOT / "examples" / "partitioned-gpus.yaml")


def _shape(names: list[str]) -> dict[str, tuple[int, int, tuple[int, ...], int]]:
    """The A100/H100 table shape (MIG.md 1.1-1.3) under one product's names:
    profile -> (compute slices, memory slices, allowed starts, max instances)."""
    one, one_me, one_big, two, three, four, seven = names
    return {
        one: (1, 1, (0, 1, 2, 3, 4, 5, 6), 7),
        one_me: (1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
        one_big: (1, 2, (0, 2, 4, 6), 4),
        two: (2, 2, (0, 2, 4), 3),
        three: (3, 4, (0, 4), 2),
        four: (4, 4, (0,), 1),
        seven: (7, 8, (0,), 1),
    }


#: The 8-slice products' profile names in `_shape`'s order (MIG.md 1.1-1.5).
NAMES = {
    "A100-40GB": ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
    "A100-80GB": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "H100-80GB": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "H100-94GB": ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"],
    "H200-141GB": ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
}
#: Product -> (memory slices, compute slices, profile table), from ../shared/reference/MIG.md.
RULES: dict[str, tuple[int, int, dict[str, tuple[int, int, tuple[int, ...], int]]]] = {
    **{product: (8, 7, _shape(names)) for product, names in NAMES.items()},
    "A30-24GB": (
        4,
        4,
        {
            "1g.6gb": (1, 1, (0, 1, 2, 3), 4),
            "1g.6gb+me": (1, 1, (0, 1, 2, 3), 1),
            "2g.12gb": (2, 2, (0, 2), 2),
            "2g.12gb+me": (2, 2, (0, 2), 1),
            "4g.24gb": (4, 4, (0,), 1),
        },
    ),
}
#: A static card's instances: mig-parted's balanced layout (MIG.md section 1 and the A30 blog's mixes).
BALANCED = {
    **{product: [(names[0], 0), (names[0], 1), (names[3], 2), (names[4], 4)] for product, names in NAMES.items()},
    "A30-24GB": [("1g.6gb", 0), ("1g.6gb", 1), ("2g.12gb", 2)],
}


def mig_node(name: str, product: str, cards: int, mode: str = "dynamic") -> Node:
    instances = [{"profile": p, "start": s} for p, s in BALANCED[product]] if mode == "static" else []
    devices = [
        {"type": "gpu", "minor": m, "mig": {"product": product, "mode": mode, "instances": instances}}
        for m in range(cards)
    ]
    return Node.model_validate({"name": name, "allocatable": {"cpu": "64", "memory": "64Gi"}, "devices": devices})


def ask(name: str, wants: dict[str, int]) -> Workload:
    requests = {"cpu": "1", **{mig_resource(p): n for p, n in wants.items()}}
    return Workload.model_validate({"name": name, "namespace": "ml", "requests": requests})


def granted(binding: Binding) -> Counter[str]:
    return Counter(g.mig.profile for g in binding.devices.get("gpu", ()) if g.mig is not None)


def placement_problems(state: ClusterState, products: dict[str, str], static: bool) -> list[str]:
    """Every held instance against `RULES`: allowed start, no slice held twice on a card, instance
    caps, compute slices, one media-extension instance per card; on a static card only the
    existing instances. `products`: node name -> product."""
    out = []
    cards: dict[tuple[str, int], list[tuple[str, str, int]]] = {}
    for key, b in state.bindings.items():
        for g in b.devices.get("gpu", ()):
            if g.mig is None:
                out.append(f"{key}: a grant without a MIG instance on a MIG card: {g}")
                continue
            cards.setdefault((b.node, g.minor), []).append((key, g.mig.profile, g.mig.start))
    for (node, minor), held in cards.items():
        memory, compute, table = RULES[products[node]]
        used = used_compute = media = 0
        for key, profile, start in held:
            c, size, starts, _ = table[profile]
            where = f"{node} gpu {minor}: {key} {profile} at {start}"
            if start not in starts:
                out.append(f"{where}: start not allowed (allowed {starts})")
            if static and (profile, start) not in BALANCED[products[node]]:
                out.append(f"{where}: not an existing instance of the static card")
            mask = ((1 << size) - 1) << start
            if mask & used or start + size > memory:
                out.append(f"{where}: a slice held twice or off the axis")
            used |= mask
            used_compute += c
            media += profile.endswith("+me")
        for profile, n in Counter(p for _, p, _ in held).items():
            if n > table[profile][3]:
                out.append(f"{node} gpu {minor}: {n} x {profile} > max {table[profile][3]}")
        if used_compute > compute or media > 1:
            out.append(f"{node} gpu {minor}: {used_compute} compute slices, {media} media-extension instances")
    return out


class IdenticalCards(RuleBasedStateMachine):
    """Random MIG requests and releases on identical nodes of identical cards: the device offer memo
    sees the same card states again and again, under different requests."""

    def __init__(self) -> None:
        super().__init__()
        self.state: ClusterState
        self.scheduler: Scheduler
        self.product = ""
        self.static = False
        self.asked: dict[str, Counter[str]] = {}
        self.count = 0

    @initialize(
        product=st.sampled_from(sorted(RULES)),
        nodes=st.integers(1, 3),
        cards=st.integers(1, 3),
        static=st.sampled_from([False, False, True]),
    )
    def setup(self, product: str, nodes: int, cards: int, static: bool) -> None:
        self.product, self.static = product, static
        mode = "static" if static else "dynamic"
        self.state = ClusterState.from_nodes([mig_node(f"n{i}", product, cards, mode) for i in range(nodes)])
        self.scheduler = Scheduler(self.state)

    @rule(data=st.data())
    def request(self, data: st.DataObject) -> None:
        profiles = sorted(RULES[self.product][2])
        chosen = data.draw(st.lists(st.sampled_from(profiles), min_size=1, max_size=2, unique=True))
        wants = {p: data.draw(st.integers(1, 3)) for p in chosen}
        self.count += 1
        workload = ask(f"w{self.count}", wants)
        try:
            binding = self.scheduler.schedule_one(workload)
        except FitError:
            return
        assert granted(binding) == Counter(wants), (wants, binding.devices)
        self.asked[binding.workload] = Counter(wants)

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        if self.state.bindings:
            key = data.draw(st.sampled_from(sorted(self.state.bindings)))
            self.scheduler.release(key)
            del self.asked[key]

    @invariant()
    def every_grant_is_what_was_asked(self) -> None:
        assert {k: granted(b) for k, b in self.state.bindings.items()} == self.asked

    @invariant()
    def no_slice_twice_and_every_start_allowed(self) -> None:
        products = {n.name: self.product for n in self.state.nodes}
        assert placement_problems(self.state, products, self.static) == []
        assert check(self.state) == []


TestIdenticalCards = IdenticalCards.TestCase
TestIdenticalCards.settings = settings(max_examples=80, stateful_step_count=20, deadline=None)


# The two reported cases ------------------------------------------------------------------------------
def mig_grants(binding: Binding) -> list[tuple[str, int, str, int]]:
    return [(binding.node, g.minor, g.mig.profile, g.mig.start) for g in binding.devices["gpu"] if g.mig]


def test_a_request_on_a_second_identical_card_gets_its_own_profile() -> None:
    scheduler = Scheduler(ClusterState.from_nodes([mig_node("a", "A100-80GB", 1), mig_node("b", "A100-80GB", 1)]))
    assert mig_grants(scheduler.schedule_one(ask("big", {"7g.80gb": 1}))) == [("a", 0, "7g.80gb", 0)]
    # b's card is in the state a's card was in when the 7g was offered: the 1g is still a 1g
    assert mig_grants(scheduler.schedule_one(ask("small", {"1g.20gb": 1}))) == [("b", 0, "1g.20gb", 6)]


def test_after_a_7g_is_released_two_1g_are_two_1g() -> None:
    state = ClusterState.from_nodes([mig_node("a", "H100-80GB", 1)])
    scheduler = Scheduler(state)
    assert mig_grants(scheduler.schedule_one(ask("big", {"7g.80gb": 1}))) == [("a", 0, "7g.80gb", 0)]
    scheduler.release("ml/big")
    pair = scheduler.schedule_one(ask("pair", {"1g.10gb": 2}))
    assert mig_grants(pair) == [("a", 0, "1g.10gb", 4), ("a", 0, "1g.10gb", 6)]
    assert check(state) == []


# The other memoized device offers ------------------------------------------------------------------------
def gpu_node(name: str, gpus: int, table: bool = False) -> Node:
    data: dict[str, Any] = {
        "name": name,
        "allocatable": {"cpu": "64", "memory": "64Gi"},
        "devices": [{"type": "gpu", "minor": m, "resources": {"gpu-memory": "80Gi"}} for m in range(gpus)],
    }
    if table:
        data["gpuPartitions"] = {
            "4": [{"minors": [0, 1, 2, 3], "allocationScore": 1}],
            "2": [{"minors": [0, 1], "allocationScore": 1}, {"minors": [2, 3], "allocationScore": 1}],
            "1": [{"minors": [m]} for m in range(4)],
        }
        data["policies"] = {"gpuPartitionPolicy": "Honor"}
    return Node.model_validate(data)


def plain(name: str, requests: dict[str, Any]) -> Workload:
    return Workload.model_validate({"name": name, "namespace": "ml", "requests": {"cpu": "1", **requests}})


def gpu_grants(binding: Binding) -> list[tuple[int, int]]:
    return [(g.minor, g.resources.get("gpu-core", 0)) for g in binding.devices["gpu"]]


@pytest.mark.parametrize(
    ("nodes", "first", "second", "expected"),
    [
        # a fractional share: the second request lands on the other card, in the state the first saw
        ((1, False), {"gpu-core": 60, "gpu-memory-ratio": 60}, {"gpu-core": 50, "gpu-memory-ratio": 50}, [(0, 50)]),
        ((1, False), {"gpu-core": 60, "gpu-memory-ratio": 60}, {"gpu-core": 50, "gpu-memory": "8Gi"}, [(0, 50)]),
        # whole GPUs through a partition table (Honor): four, then two
        ((4, True), {"nvidia.com/gpu": 4}, {"nvidia.com/gpu": 2}, [(0, 100), (1, 100)]),
        ((4, True), {"nvidia.com/gpu": 2}, {"nvidia.com/gpu": 1}, [(0, 100)]),
    ],
)
def test_other_memoized_offers_answer_their_own_request(
    nodes: tuple[int, bool], first: dict[str, Any], second: dict[str, Any], expected: list[tuple[int, int]]
) -> None:
    gpus, table = nodes
    scheduler = Scheduler(ClusterState.from_nodes([gpu_node("a", gpus, table), gpu_node("b", gpus, table)]))
    a = scheduler.schedule_one(plain("first", first))
    b = scheduler.schedule_one(plain("second", second))
    assert a.node != b.node  # the second request saw the device state the first one's offer was made for
    assert gpu_grants(b) == expected
    if "gpu-memory" in second:
        assert b.devices["gpu"][0].resources["gpu-memory"] == 8 * 2**30


# finesched plan carries the MIG grant ----------------------------------------------------------------------
NOTEBOOK = [{"minor": 1, "resources": {}, "mig": {"profile": "2g.20gb", "start": 0, "uuid": None}}]


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_plan_output_carries_the_mig_grant(fmt: str) -> None:
    result = CliRunner().invoke(app, ["plan", EXAMPLE, "-o", fmt])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout) if fmt == "json" else yaml.safe_load(result.stdout)
    by_name = {r["workload"]: r for r in doc["results"]}
    assert by_name["ml/notebook"]["devices"] == {"gpu": NOTEBOOK}
    small = by_name["ml/small-inference"]["devices"]["gpu"]
    assert [(g["minor"], g["mig"]["profile"], g["mig"]["start"]) for g in small] == [(0, "1g.6gb", 2), (0, "1g.6gb", 3)]
    assert all(g["mig"]["uuid"].startswith("MIG-") for g in small)  # a static card's existing instances
    # the same serializer as the server's binding view: one shape for every client
    scheduler = Scheduler(ClusterState.from_nodes([mig_node("h", "H100-80GB", 2)]))
    binding = scheduler.schedule_one(ask("notebook", {"2g.20gb": 1}))
    assert binding.devices_doc()["gpu"][0].keys() == NOTEBOOK[0].keys()


def test_plan_table_shows_the_mig_grant_per_gpu() -> None:
    result = CliRunner().invoke(app, ["plan", EXAMPLE], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") >= 5}
    assert "gpu 1: MIG 2g.20gb at start 0" in rows["ml/notebook"]
    assert "gpu 0: MIG 1g.6gb at starts 2, 3" in rows["ml/small-inference"]
