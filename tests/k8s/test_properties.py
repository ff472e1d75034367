"""Properties of the extender: filter partitions its input; bound-Pod annotations round-trip; requests follow
kube-scheduler's rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from finesched.cpuset import CPUSet
from finesched.k8s import wire
from finesched.k8s.convert import pod_binding, pod_workload
from finesched.k8s.extender import binding_annotations
from finesched.k8s.setup import extender_from_manifests
from finesched.model.binding import Binding, DeviceGrant
from finesched.model.resources import ResourceVector

HERE = Path(__file__).parent
EXTENDER = extender_from_manifests(HERE / "fixture-cluster.yaml")
POD = json.loads((HERE / "fixtures" / "extender-filter-request-nodecache.json").read_text())["Pod"]

node_names = st.lists(st.sampled_from(["gpu-node-a", "gpu-node-b", "elsewhere", "x.y", "gpu-node-a "]), max_size=8)


@given(node_names, st.booleans())
def test_filter_partitions_the_nodes_it_was_given(names: list[str], full: bool) -> None:
    items = [{"metadata": {"name": n}} for n in names]
    args = wire.ExtenderArgs(POD, names, items if full else None)
    result = EXTENDER.filter(args)
    passed = [i["metadata"]["name"] for i in result["Nodes"]["items"]] if full else result["NodeNames"]
    failed, final = result["FailedNodes"], result["FailedAndUnresolvableNodes"]
    assert passed == [n for n in names if n == "gpu-node-a"]  # a subset, in the order given
    assert not set(failed) & set(final) and not set(passed) & (set(failed) | set(final))
    assert set(passed) | set(failed) | set(final) == set(names)
    assert all(reason for reason in (*failed.values(), *final.values()))
    scores = EXTENDER.prioritize(args)
    assert len(scores) == len(names) and all(0 <= s <= 10 for s in scores)
    assert json.loads(wire.encode_priorities(names, scores)) == wire.host_priorities(names, scores)


grants = st.lists(
    st.builds(
        lambda minor, core, ratio: DeviceGrant(
            minor=minor, resources=ResourceVector({"gpu-core": core, "gpu-memory-ratio": ratio})
        ),
        st.integers(0, 15),
        st.integers(1, 100),
        st.integers(1, 100),
    ),
    min_size=1,
    max_size=4,
    unique_by=lambda g: g.minor,
)


@given(grants, st.sets(st.integers(0, 127), max_size=16))
def test_bound_pod_annotations_round_trip(devices: list[DeviceGrant], cpus: set[int]) -> None:
    status = json.dumps({"cpuset": str(CPUSet(cpus))}) if cpus else None
    binding = Binding(
        workload="ml/p",
        node="n",
        cpuset=CPUSet(cpus),
        devices={"gpu": devices},
        annotations={"scheduling.koordinator.sh/resource-status": status} if status else {},
    )
    pod = {
        "metadata": {"name": "p", "namespace": "ml", "annotations": binding_annotations(binding)},
        "spec": {"nodeName": "n", "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
    }
    back = pod_binding(pod, lambda name: False)
    assert back.devices == binding.devices and back.cpuset == binding.cpuset
    assert binding_annotations(back) == binding_annotations(binding)


millis = st.integers(0, 8000)


def _container(cpu: int, restart: str | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "c", "resources": {"requests": {"cpu": f"{cpu}m"}}}
    if restart:
        c["restartPolicy"] = restart
    return c


@given(st.lists(millis, min_size=1, max_size=4), st.lists(st.tuples(millis, st.booleans()), max_size=4), millis)
def test_requests_follow_kube_schedulers_rule(regular: list[int], inits: list[tuple[int, bool]], overhead: int) -> None:
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [_container(c) for c in regular],
            "initContainers": [_container(c, "Always" if side else None) for c, side in inits],
            "overhead": {"cpu": f"{overhead}m"},
        },
    }
    sidecars = sum(c for c, side in inits if side)
    running = sum(regular) + sidecars  # regular containers beside every sidecar
    # each plain init container runs beside the sidecars declared before it
    starting = [c + sum(s for s, side2 in inits[:i] if side2) for i, (c, side) in enumerate(inits) if not side]
    cumulative = [sum(s for s, side2 in inits[: i + 1] if side2) for i, (c, side) in enumerate(inits) if side]
    expected = max([running, *starting, *cumulative]) + overhead
    assert pod_workload(pod).requests.get("cpu", 0) == expected
