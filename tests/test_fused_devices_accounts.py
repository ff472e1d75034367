"""DeviceAccounts.assume / forget read a node's rows once and write each type's grants in one go
(`DeviceTypeAccounts.take_many`). On random nodes (sparse minors, unhealthy devices, two types) and
random grants (missing minors, repeats, too large, unknown dimensions), they refuse with the same
words and leave the same arrays as the one-device-one-dimension-at-a-time code they replaced (kept
here as `ReferenceAccounts`)."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from finesched.model.binding import Binding, DeviceGrant
from finesched.model.node import Node
from finesched.state.cluster import StateError
from finesched.state.devices import DeviceAccounts, device_dimension

GI = 2**30
MEMORY = ["40Gi", "80Gi"]


class ReferenceAccounts(DeviceAccounts):
    """The accounts with the per-(device, dimension) assume and forget."""

    def assume(self, index: int, binding: Binding) -> None:
        i, key, devices = index, binding.workload, binding.devices
        where = f"{self._names[i]}"
        replay = key in self._replay[i] or self.rebuilding
        plan = []
        on_unhealthy = False
        for kind, grants in devices.items():
            acc = self.types.get(kind)
            seen: set[int] = set()
            for grant in grants:
                slot = None if acc is None else acc.slot_of(i, grant.minor)
                if acc is None or slot is None:
                    raise StateError(f"binding {key}: {where} has no {kind} with minor {grant.minor}")
                if slot in seen:
                    raise StateError(f"binding {key}: {kind} {grant.minor} granted twice")
                seen.add(slot)
                if not acc.healthy[i, slot]:
                    if not replay:
                        raise StateError(f"binding {key}: {kind} {grant.minor} on {where} is unhealthy")
                    on_unhealthy = True
                for name, amount in grant.resources.items():
                    k = acc.dim_index.get(name)
                    if k is None:
                        k = acc.dim_index.get(device_dimension(name))
                    if k is None or amount < 0:
                        raise StateError(f"binding {key}: {kind} {grant.minor} has no {name} dimension")
                    have = int(acc.free[k, i, slot])
                    if amount > have:
                        raise StateError(
                            f"binding {key} does not fit on {where}: {kind} {grant.minor} {name} "
                            f"(asks {amount}, {have} free)"
                        )
                    plan.append((acc, k, slot, amount))
        for acc, k, slot, amount in plan:
            acc.take(i, k, slot, amount)
        self._held[i][key] = binding
        if on_unhealthy:
            self._tolerated[i].add(key)
        self.note_changed(i)

    def forget(self, index: int, binding: Binding) -> None:
        i = index
        held = self._held[i].pop(binding.workload, None)
        self._tolerated[i].discard(binding.workload)
        if held is None:
            return
        for kind, grants in held.devices.items():
            acc = self.types[kind]
            for grant in grants:
                slot = acc.slot_of(i, grant.minor)
                for name, amount in grant.resources.items():
                    acc.take(i, acc.dim_index[name], slot, -amount)
        self.note_changed(i)


@st.composite
def nodes(draw: st.DrawFn, name: str) -> Node:
    minors = draw(st.lists(st.integers(0, 5), min_size=3, max_size=6, unique=True))
    devices: list[dict[str, Any]] = [
        {
            "type": "gpu",
            "minor": m,
            "health": draw(st.sampled_from([True, True, True, False])),
            "resources": {"gpu-core": 100, "gpu-memory-ratio": 100, "gpu-memory": draw(st.sampled_from(MEMORY))},
        }
        for m in minors
    ]
    devices += [{"type": "rdma", "minor": r} for r in range(draw(st.integers(0, 2)))]
    return Node.model_validate({"name": name, "allocatable": {"cpu": "8", "memory": "8Gi"}, "devices": devices})


GRANTS = st.lists(
    st.tuples(
        st.sampled_from(["gpu", "gpu", "gpu", "gpu", "gpu", "rdma"]),
        st.integers(0, 6),
        st.dictionaries(
            st.sampled_from(["gpu-core", "gpu-core", "gpu-memory-ratio", "gpu-memory", "rdma", "fpga"]),
            st.sampled_from([0, 10, 25, 50, 10, 25, 50, 100, 10 * GI, 40 * GI]),
            min_size=1,
            max_size=2,
        ),
    ),
    min_size=1,
    max_size=4,
)


def arrays(accounts: DeviceAccounts) -> dict[str, list[Any]]:
    return {
        kind: [getattr(acc, f).tolist() for f in ("free", "hfree", "htotal", "used_share")]
        for kind, acc in accounts.types.items()
    }


def outcome(accounts: DeviceAccounts, call: Any) -> str | None:
    try:
        call()
    except StateError as exc:
        return str(exc)
    return None


@given(
    cluster=st.lists(nodes("n"), min_size=1, max_size=3),
    steps=st.lists(st.tuples(st.integers(0, 2), GRANTS, st.booleans()), max_size=12),
)
@settings(max_examples=200, deadline=None)
def test_assume_and_forget_equal_the_per_dimension_code(
    cluster: list[Node], steps: list[tuple[int, list[Any], bool]]
) -> None:
    mine, ref = DeviceAccounts(), ReferenceAccounts()
    for accounts in (mine, ref):
        accounts.resize(len(cluster))
        for i, node in enumerate(cluster):
            accounts.set_node(i, node.model_copy(update={"name": f"n{i}"}))
    bound: list[tuple[int, Binding]] = []
    for step, (at, grants, release) in enumerate(steps):
        if release and bound:
            i, b = bound.pop(0)
            mine.forget(i, b)
            ref.forget(i, b)
        else:
            i = at % len(cluster)
            devices: dict[str, list[DeviceGrant]] = {}
            for kind, minor, resources in grants:
                devices.setdefault(kind, []).append(DeviceGrant(minor=minor, resources=resources))
            b = Binding(workload=f"d/w{step}", node=f"n{i}", devices=devices)
            got = outcome(mine, lambda b=b, i=i: mine.assume(i, b))
            assert got == outcome(ref, lambda b=b, i=i: ref.assume(i, b))
            if got is None:
                bound.append((i, b))
        assert arrays(mine) == arrays(ref)
        assert not any(np.isnan(acc.used_share).any() for acc in mine.types.values())
