"""Elastic quotas: validation (field paths), max along the tree, borrowing idle capacity, reclaim."""

from __future__ import annotations

import pydantic
import pytest

from builders import make_node, make_workload
from finesched.errors import ValidationError
from finesched.model.binding import Binding
from finesched.model.manifest import parse_manifest
from finesched.model.tenant import Tenant
from finesched.sched.diagnosis import QuotaWait
from finesched.sched.elastic import QuotaTree
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState


def tenant(name: str, **spec: object) -> Tenant:
    return Tenant.model_validate({"name": name, **spec})


@pytest.mark.parametrize(
    ("spec", "path", "text"),
    [
        pytest.param(
            {"min": {"cpu": "8"}, "max": {"cpu": "4"}}, ("min", "cpu"), "is above max (4)", id="min-above-max"
        ),
        # nvidia.com/gpu: 2 is gpu-core 200: above a max of gpu-core 100
        pytest.param(
            {"min": {"nvidia.com/gpu": 2}, "max": {"koordinator.sh/gpu-core": 100}},
            ("min", "nvidia.com/gpu"),
            "is above max",
            id="whole-gpus-translated",
        ),
        pytest.param({"min": {"cpu": "-1"}}, ("min", "cpu"), "", id="negative-min"),
        pytest.param({"max": {"memory": "-1Gi"}}, ("max", "memory"), "", id="negative-max"),
        pytest.param({"parent": "a"}, ("parent",), "its own parent", id="own-parent"),
    ],
)
def test_tenant_validation_names_the_field(spec: dict[str, object], path: tuple[str, ...], text: str) -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        tenant("a", **spec)
    errors = info.value.errors()
    assert any(e["loc"] == path and text in e["msg"] for e in errors), errors


def test_tree_unknown_parent_and_cycle() -> None:
    with pytest.raises(ValidationError) as info:
        QuotaTree([tenant("a", parent="nobody")])
    assert str(info.value) == 'tenant a: parent: "nobody" names no tenant'
    with pytest.raises(ValidationError) as info:
        QuotaTree([tenant("a", parent="b"), tenant("b", parent="c"), tenant("c", parent="a")])
    assert "makes a cycle (a -> b -> c -> a)" in str(info.value)
    with pytest.raises(ValidationError):  # the Scheduler refuses such a tree when it starts
        Scheduler(ClusterState(), tenants=[tenant("a", parent="nobody")])


def one_node(cpu: str = "8") -> ClusterState:
    return ClusterState.from_nodes([make_node("n1").cpu(cpu).memory("64Gi").obj()])


def jobs(team: str, count: int, first: int = 0, priority: int = 0, cpu: str = "1") -> list:
    return [
        make_workload(f"{team}{i}").req(cpu=cpu).tenant(team).priority(priority).obj()
        for i in range(first, first + count)
    ]


def held(s: Scheduler, team: str) -> int:
    return s.usage.of(team).get("cpu", 0)


def test_max_caps_the_subtree() -> None:
    # org (max 5 CPUs) has children x and y: x takes 3, y may then take only 2 of its 4.
    tenants = [tenant("org", max={"cpu": "5"}), tenant("x", parent="org"), tenant("y", parent="org")]
    s = Scheduler(one_node(), tenants=tenants)
    s.submit(jobs("x", 3) + jobs("y", 4))
    results = s.run()
    waits = [r for r in results if isinstance(r, QuotaWait)]
    assert (held(s, "x"), held(s, "y")) == (3000, 2000)
    assert len(waits) == 2 and "tenant org would exceed its max" in waits[0].message


def test_borrow_idle_then_reclaim_newest() -> None:
    # 8 CPUs; a and b are each guaranteed 4 (max 8). b is idle, so a borrows all 8 (4 above its min).
    tenants = [tenant("a", min={"cpu": "4"}, max={"cpu": "8"}), tenant("b", min={"cpu": "4"}, max={"cpu": "8"})]
    s = Scheduler(one_node(), tenants=tenants)
    s.submit(jobs("a", 8))
    assert all(isinstance(r, Binding) for r in s.run()) and held(s, "a") == 8000
    # b comes back with 2 CPUs of work at the same priority: a's two newest workloads (a7, a6) go.
    s.submit(jobs("b", 2))
    assert all(isinstance(r, Binding) for r in s.run())
    evicted = [k for p in s.take_preemptions() for k in p.victim_keys]
    assert sorted(evicted) == ["default/a6", "default/a7"]
    # b asks up to its min (2 more): a goes down to exactly its min, 4.
    s.submit(jobs("b", 2, first=2))
    s.run()
    assert (held(s, "a"), held(s, "b")) == (4000, 4000)
    assert sorted(k for p in s.take_preemptions() for k in p.victim_keys) == ["default/a4", "default/a5"]
    # Above its min b may not reclaim: a holds its min and is never a victim. b's fifth waits.
    s.submit(jobs("b", 1, first=4))
    (result,) = s.run()
    assert not isinstance(result, Binding) and held(s, "a") == 4000
    assert not s.take_preemptions()


def test_reclaim_never_takes_a_tenant_below_its_min() -> None:
    # a holds 6 of min 4 with 2-CPU workloads; b (min 4) needs 2: evicting one of a's 2-CPU
    # workloads leaves a at 4 (= min): allowed. Needing 4 more would take a to 2: refused.
    tenants = [tenant("a", min={"cpu": "4"}), tenant("b", min={"cpu": "4"})]
    s = Scheduler(one_node("6"), tenants=tenants)
    s.submit(jobs("a", 3, cpu="2"))
    s.run()
    s.submit(jobs("b", 1, cpu="4"))
    (result,) = s.run()
    assert not isinstance(result, Binding) and held(s, "a") == 6000
    s2 = Scheduler(one_node("6"), tenants=tenants)
    s2.submit(jobs("a", 3, cpu="2"))
    s2.run()
    s2.submit(jobs("b", 1, cpu="2"))
    (result,) = s2.run()
    assert isinstance(result, Binding) and (held(s2, "a"), held(s2, "b")) == (4000, 2000)


def test_whole_gpu_quota_counts_fractional_requests() -> None:
    # max nvidia.com/gpu: 1 = gpu-core 100: two half-GPU workloads fit, a third waits.
    node = make_node("n1").cpu("8").memory("64Gi").gpus(2).obj()
    s = Scheduler(ClusterState.from_nodes([node]), tenants=[tenant("t", max={"nvidia.com/gpu": 1})])
    half = {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}
    s.submit([make_workload(f"w{i}").req(cpu="1", **half).tenant("t").obj() for i in range(3)])
    results = s.run()
    assert [type(r).__name__ for r in results] == ["Binding", "Binding", "QuotaWait"]
    assert "gpu-core (holds 100, asks 50, max 100)" in results[2].message


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        pytest.param({"min": {"cpu": "8"}, "max": {"cpu": "4"}}, "spec.min.cpu", id="min-above-max"),
        pytest.param({"min": {"cpu": "-2"}}, "spec.min.cpu", id="negative"),
        pytest.param({"parent": ""}, "spec.parent", id="empty-parent"),
        pytest.param({"mni": {"cpu": "2"}}, "spec.mni", id="typo"),
    ],
)
def test_manifest_errors_name_the_field(spec: dict[str, object], path: str) -> None:
    doc = {"apiVersion": "finesched.io/v1alpha1", "kind": "Tenant", "metadata": {"name": "a"}, "spec": spec}
    with pytest.raises(ValidationError) as info:
        parse_manifest(doc, where="tenants.yaml")
    assert any(e.path == path for e in info.value.errors), [str(e) for e in info.value.errors]


def test_manifest_tree_loads() -> None:
    docs = [
        {"kind": "Tenant", "metadata": {"name": "org"}, "spec": {"min": {"nvidia.com/gpu": 4}, "max": {"cpu": "64"}}},
        {"kind": "Tenant", "metadata": {"name": "team"}, "spec": {"parent": "org", "min": {"cpu": "8"}}},
    ]
    tenants = [parse_manifest({"apiVersion": "finesched.io/v1alpha1", **d}) for d in docs]
    tree = QuotaTree(tenants)  # type: ignore[arg-type]
    assert tree.min["org"] == {"gpu-core": 400, "gpu-memory-ratio": 400}
    assert tree.ancestors("team") == ["team", "org"] and tree.subtree("org") == ["org", "team"]


def test_reclaim_under_a_parents_min() -> None:
    # prod (min 4 CPUs) has children web and api without a min of their own; batch has none.
    # batch borrows all 8 CPUs; web's 2 CPUs reclaim under prod's min (prod's subtree holds 0 + 2
    # <= 4): batch's two newest go. api then takes prod to 4 = min; a fifth prod CPU would go
    # above it: no reclaim, it waits.
    tenants = [
        tenant("prod", min={"cpu": "4"}),
        tenant("web", parent="prod"),
        tenant("api", parent="prod"),
        tenant("batch"),
    ]
    s = Scheduler(one_node(), tenants=tenants)
    s.submit(jobs("batch", 8))
    s.run()
    s.submit(jobs("web", 2))
    s.run()
    assert sorted(k for p in s.take_preemptions() for k in p.victim_keys) == ["default/batch6", "default/batch7"]
    s.submit(jobs("api", 2))
    s.run()
    assert (held(s, "web"), held(s, "api"), held(s, "batch")) == (2000, 2000, 4000)
    s.take_preemptions()
    s.submit(jobs("api", 1, first=2))
    (result,) = s.run()
    assert not isinstance(result, Binding) and not s.take_preemptions()
