"""MIG through the scheduler: requests and their validation, reasons, static vs dynamic cards, a card
that is either MIG or shared, name ownership, reports of instances, release, rebuild and preemption."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from finesched.model.binding import Binding
from finesched.model.device_allocated import format_device_allocated, parse_device_allocated
from finesched.model.mig import mig_profile_of, mig_resource
from finesched.model.node import Node
from finesched.model.workload import Workload
from finesched.sched.diagnosis import FitError
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState, StateError
from finesched.state.invariants import check
from finesched.state.mig_slices import apply_mig_report, attach_mig_slices


def node(name: str = "m", mode: str = "dynamic", cards: int = 2, instances: list | None = None, **extra: Any) -> Node:
    mig = {"product": "H100-80GB", "mode": mode, "instances": instances or []}
    devices = [{"type": "gpu", "minor": m, "uuid": f"GPU-{m}", "mig": mig} for m in range(cards)]
    data = {"name": name, "allocatable": {"cpu": "32", "memory": "64Gi"}, "devices": devices, **extra}
    return Node.model_validate(data)


def ask(name: str, priority: int = 0, **mig: int) -> Workload:
    requests = {"cpu": "1", **{mig_resource(p.replace("_", ".").replace(".me", "+me")): n for p, n in mig.items()}}
    return Workload.model_validate({"name": name, "namespace": "ml", "priority": priority, "requests": requests})


def grants(binding: Binding) -> list[tuple[int, str, int]]:
    return [(g.minor, g.mig.profile, g.mig.start) for g in binding.devices["gpu"] if g.mig]


def test_resource_names() -> None:
    assert mig_profile_of("nvidia.com/mig-3g.40gb") == "3g.40gb"
    assert mig_profile_of("nvidia.com/mig-1g.10gb.me") == "1g.10gb+me"  # the device plugin's spelling
    assert mig_resource("1g.10gb+me") == "nvidia.com/mig-1g.10gb.me"
    assert mig_profile_of("nvidia.com/mig-foo") is None and mig_profile_of("nvidia.com/gpu") is None


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        ({"nvidia.com/mig-3g": 1}, "is not a MIG profile"),
        ({"nvidia.com/mig-3g.40gb": 1, "nvidia.com/gpu": 1}, "not both"),
        (
            {"nvidia.com/mig-3g.40gb": 1, "koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50},
            "not both",
        ),
    ],
)
def test_bad_requests_name_the_field(requests: dict[str, Any], message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=message) as exc:
        Workload.model_validate({"name": "w", "requests": requests})
    assert exc.value.errors()[0]["loc"][0] == "requests"


def test_a_card_is_mig_or_shared_never_both() -> None:
    with pytest.raises(pydantic.ValidationError, match="is in MIG mode"):
        node(foreignAllocations=[{"type": "gpu", "minor": 0, "resources": {"gpu-core": 10}}])
    with pytest.raises(pydantic.ValidationError, match="only a gpu can be in MIG mode"):
        Node.model_validate({"name": "x", "devices": [{"type": "rdma", "minor": 0, "mig": {"product": "A30-24GB"}}]})
    mixed = Node.model_validate(
        {"name": "x", "allocatable": {"cpu": "8", "memory": "8Gi"},
         "devices": [{"type": "gpu", "minor": 0, "mig": {"product": "A30-24GB"}},
                     {"type": "gpu", "minor": 1, "resources": {"gpu-memory": "24Gi"}}]}
    )  # fmt: skip
    scheduler = Scheduler(ClusterState.from_nodes([mixed]))
    share = Workload.model_validate({"name": "s", "requests": {"koordinator.sh/gpu": 50}})
    assert scheduler.schedule_one(share).device_minors("gpu") == [1]  # never the MIG card
    b = scheduler.schedule_one(Workload.model_validate({"name": "m", "requests": {"nvidia.com/mig-4g.24gb": 1}}))
    assert grants(b) == [(0, "4g.24gb", 0)]
    with pytest.raises(FitError, match="insufficient gpu-core on any single GPU"):  # the shared one is busy
        scheduler.schedule_one(Workload.model_validate({"name": "w", "requests": {"nvidia.com/gpu": 1}}))


def test_mig_names_stay_scalar_without_a_mig_card() -> None:
    # a device plugin's advertised count (mixed strategy) is an ordinary extended resource
    plain = Node.model_validate(
        {"name": "p", "allocatable": {"cpu": "8", "memory": "8Gi", "nvidia.com/mig-1g.10gb": 3}}
    )
    scheduler = Scheduler(ClusterState.from_nodes([plain]))
    b = scheduler.schedule_one(ask("a", **{"1g_10gb": 2}))
    assert b.requests["nvidia.com/mig-1g.10gb"] == 2 and not b.devices


def test_reasons() -> None:
    static = node("s", "static", 1, [{"profile": "3g.40gb", "start": 4, "uuid": "MIG-x"}])
    plain = Node.model_validate({"name": "p", "allocatable": {"cpu": "8", "memory": "8Gi"}})
    scheduler = Scheduler(ClusterState.from_nodes([node("d", cards=1), static, plain]))
    scheduler.schedule_one(ask("big", **{"7g_80gb": 1}))
    with pytest.raises(FitError) as exc:
        scheduler.schedule_one(ask("a", **{"4g_40gb": 1}))
    text = str(exc.value)
    assert "1 node has no MIG GPU" in text
    assert "1 insufficient free slices for 4g.40gb MIG instances" in text
    assert "1 insufficient free 4g.40gb MIG instances (static MIG GPUs)" in text
    with pytest.raises(FitError, match=r"no MIG GPU of the node has profile 3g\.20gb"):
        scheduler.schedule_one(ask("b", **{"3g_20gb": 1}))


def test_static_assigns_the_existing_instance_with_its_uuid_and_release_frees_it() -> None:
    static = node("s", "static", 1, [{"profile": "3g.40gb", "start": 4, "uuid": "MIG-x"}])
    state = ClusterState.from_nodes([static])
    scheduler = Scheduler(state)
    b = scheduler.schedule_one(ask("a", **{"3g_40gb": 1}))
    (g,) = b.devices["gpu"]
    assert (g.mig.profile, g.mig.start, g.mig.uuid) == ("3g.40gb", 4, "MIG-x")
    assert parse_device_allocated(b.annotations["scheduling.koordinator.sh/device-allocated"]) == b.devices
    with pytest.raises(FitError):
        scheduler.schedule_one(ask("b", **{"3g_40gb": 1}))
    scheduler.release("ml/a")
    assert grants(scheduler.schedule_one(ask("b", **{"3g_40gb": 1}))) == [(0, "3g.40gb", 4)]
    assert check(state) == []


def test_annotation_round_trip() -> None:
    text = (
        '{"gpu":[{"minor":1,"resources":{"nvidia.com/mig-1g.10gb.me":"1"},'
        '"extension":{"mig":{"profile":"1g.10gb+me","start":6,"uuid":"MIG-y"}}}]}'
    )
    assert format_device_allocated(parse_device_allocated(text)) == text


def test_dynamic_packs_onto_used_cards_and_keeps_large_profiles() -> None:
    scheduler = Scheduler(ClusterState.from_nodes([node()]))
    placed = [grants(scheduler.schedule_one(ask(f"w{i}", **{"1g_10gb": 1})))[0] for i in range(3)]
    # the first 1g goes to 6 (keeps 4g@0), the next ones fill the same card (a fresh card would lose its 7g)
    assert placed == [(0, "1g.10gb", 6), (0, "1g.10gb", 4), (0, "1g.10gb", 5)]
    assert grants(scheduler.schedule_one(ask("big", **{"4g_40gb": 1}))) == [(0, "4g.40gb", 0)]
    assert grants(scheduler.schedule_one(ask("full", **{"7g_80gb": 1}))) == [(1, "7g.80gb", 0)]


def test_reported_instances_update_the_cards_and_conflicts_are_refused() -> None:
    state = ClusterState.from_nodes([node(cards=1)])
    scheduler = Scheduler(state)
    assert grants(scheduler.schedule_one(ask("a", **{"3g_40gb": 1}))) == [(0, "3g.40gb", 4)]  # keeps 4g@0
    # the agent made it and reports it with its UUID
    apply_mig_report(state, "m", {"0": [{"profile": "3g.40gb", "start": 4, "uuid": "MIG-made"}]})
    card = attach_mig_slices(state).cards[0][0]
    assert card.uuid_of(card.geometry.placement_lookup[("3g.40gb", 4)]) == "MIG-made"
    # an instance overlapping the held one cannot be true of this node: refused, nothing changed
    with pytest.raises(StateError, match=r"overlapping 3g\.40gb held by a binding"):
        apply_mig_report(state, "m", {"0": [{"profile": "1g.10gb", "start": 5}]})
    assert attach_mig_slices(state).cards[0][0] == card
    # an instance made outside finesched occupies its slices (assignable as it is, like on a static card)
    apply_mig_report(state, "m", {"0": [{"profile": "3g.40gb", "start": 4}, {"profile": "2g.20gb", "start": 0}]})
    with pytest.raises(FitError, match=r"insufficient free slices for 4g\.40gb"):
        scheduler.schedule_one(ask("b", **{"4g_40gb": 1}))
    assert check(state) == []


def test_rebuild_and_update_keep_the_held_instances() -> None:
    state = ClusterState.from_nodes([node(cards=1)])
    scheduler = Scheduler(state)
    scheduler.schedule_one(ask("a", **{"2g_20gb": 1}))
    fresh = ClusterState.from_nodes([node(cards=1)])
    for b in state.bindings.values():
        fresh.assume(b)
    assert attach_mig_slices(fresh).cards[0] == attach_mig_slices(state).cards[0]
    unhealthy = node(cards=1).model_copy(
        update={"devices": (node(cards=1).devices[0].model_copy(update={"health": False}),)}
    )
    state.update_node(unhealthy)  # the held instance stays, nothing new is placed
    assert check(state) == []
    with pytest.raises(FitError):
        scheduler.schedule_one(ask("b", **{"1g_10gb": 1}))
    static_without = node(mode="static", cards=1)
    with pytest.raises(StateError, match="no longer fit"):
        state.update_node(static_without)  # a static card must have the held instance


def test_preemption_for_a_mig_request_is_refused_cleanly() -> None:
    """DefaultPreemption's candidate model does not count MIG slices yet (see README): it must say
    so and leave the state as it was, never evict for nothing."""
    state = ClusterState.from_nodes([node(cards=1)])
    profile = {
        "name": "p",
        "plugins": [{"name": "ResourcesFit"}, {"name": "DeviceShare"}, {"name": "DefaultPreemption"}],
    }
    scheduler = Scheduler(state, profile)
    scheduler.schedule_one(ask("low", priority=0, **{"4g_40gb": 1}))
    scheduler.schedule_one(ask("low2", priority=0, **{"3g_40gb": 1}))
    plan, why = scheduler.find_preemption(ask("high", priority=10, **{"7g_80gb": 1}))
    assert plan is None and why
    assert sorted(state.bindings) == ["ml/low", "ml/low2"] and check(state) == []


def test_example_manifest_round_trips_and_schedules() -> None:
    import json
    from pathlib import Path

    from finesched import load_manifests

    m = load_manifests(str(Path(__file__).resolve().parent.parent / "examples" / "partitioned-gpus.yaml"))
    for n in m.nodes:  # what the server stores (JSON) reads back as the same node
        assert Node.model_validate(json.loads(json.dumps(n.model_dump(mode="json", by_alias=True)))) == n
    scheduler = Scheduler(ClusterState.from_nodes(m.nodes))
    placed = {w.name: scheduler.schedule_one(w) for w in m.workloads}
    assert placed["allreduce-pair"].node == "hgx-0" and placed["allreduce-pair"].device_minors("gpu") == [0, 1]
    assert grants(placed["notebook"]) == [(1, "2g.20gb", 0)]  # beside the existing 3g, not on the empty card
    assert grants(placed["small-inference"]) == [(0, "1g.6gb", 2), (0, "1g.6gb", 3)]


def test_a_report_supersedes_the_registered_instances_on_later_updates() -> None:
    """The server re-applies the stored manifest on every report (update_node) before the report: an
    instance the agent registered and later reported gone must not come back and clash."""
    registered = node(cards=1, instances=[{"profile": "1g.10gb", "start": 4}])
    state = ClusterState.from_nodes([registered])
    scheduler = Scheduler(state)
    apply_mig_report(state, "m", {"0": []})  # the 1g at 4 was destroyed
    assert grants(scheduler.schedule_one(ask("a", **{"3g_40gb": 1}))) == [(0, "3g.40gb", 4)]
    state.update_node(registered)  # the stored manifest still lists the old 1g
    apply_mig_report(state, "m", {"0": [{"profile": "3g.40gb", "start": 4}]})
    assert check(state) == []
    fresh = node(cards=1, mode="dynamic", instances=[{"profile": "3g.40gb", "start": 4, "uuid": "MIG-new"}])
    state.update_node(fresh)  # a re-registration (new manifest) is taken as it is
    assert attach_mig_slices(state).cards[0][0].uuids == (
        (attach_mig_slices(state).cards[0][0].geometry.placement_lookup[("3g.40gb", 4)], "MIG-new"),
    )
