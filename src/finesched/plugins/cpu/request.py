"""What a workload asks of the CPU and NUMA plugins, compiled once per cycle (seed S3.1, S3.4-S3.7).

Both CPUOrchestration and NUMAAlign need it, so whichever pre_filter runs first compiles it and
stores it under `CPU_REQUEST`; the other reads it (`cpu_request`). Plugin defaults ("Default"
bind / exclusive policy) are applied later, by CPUOrchestration, so the compiled form does not
depend on which plugin compiled it.

The typed fields of the workload win; Koordinator's annotations are read as a fallback, so pods
converted from Kubernetes keep their policies: ``scheduling.koordinator.sh/resource-spec``
(required/preferred bind policy, exclusive policy) and ``scheduling.koordinator.sh/numa-topology-spec``
(``numaTopologyPolicy``).
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass, field

from finesched.cpuset import CPUSet
from finesched.hashed import HashedOnce
from finesched.model.resources import CPU, MEMORY
from finesched.model.workload import EXCLUSIVE_QOS, Workload
from finesched.sched.cycle_state import CycleState, StateKey
from finesched.sched.memo import request_shape
from finesched.state.cpu_topology import check_choice

ANNOTATION_RESOURCE_SPEC = "scheduling.koordinator.sh/resource-spec"
ANNOTATION_NUMA_TOPOLOGY_SPEC = "scheduling.koordinator.sh/numa-topology-spec"
POD_BIND_POLICIES = ("Default", "FullPCPUs", "SpreadByPCPUs", "ConstrainedBurst")
POD_EXCLUSIVE_POLICIES = ("Default", "None", "PCPULevel", "NUMANodeLevel")
POD_NUMA_POLICIES = ("", "None", "BestEffort", "Restricted", "SingleNUMANode")


@dataclass(frozen=True, slots=True)
class CPURequest(HashedOnce):
    """The CPU/NUMA side of one workload, in canonical units."""

    cpu_milli: int
    cpu_limit_milli: int  # the limit, or the request when there is none (ConstrainedBurst fits by limit)
    memory: int
    qos: str
    exclusive: bool  # LSE / LSR: an exclusive cpuset on every node
    static_exclusive: bool  # Guaranteed with whole CPUs: exclusive on kubelet-static nodes (S3.8)
    required_bind: str  # the workload's required bind policy, "" if none
    preferred_bind: str  # "" means Default (the plugin's default)
    exclusive_policy: str  # "" means Default
    numa_policy: str  # the workload's NUMA topology policy, "" if none
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    __hash__ = HashedOnce.__hash__  # not the dataclass's: hashed once (finesched/hashed.py)

    @property
    def cpus(self) -> int:
        """Whole CPUs asked for (exclusive cpusets are whole CPUs by validation)."""
        return self.cpu_milli // 1000

    @property
    def constrained_burst(self) -> bool:
        """An LS workload bound to one NUMA node's shared pool (S3.4 ConstrainedBurst)."""
        return not self.exclusive and "ConstrainedBurst" in (self.required_bind, self.preferred_bind)

    def exclusive_on(self, kubelet_static: bool) -> bool:
        """Whether the workload gets an exclusive cpuset on a node (of this kubelet policy)."""
        return self.exclusive or (self.static_exclusive and kubelet_static)


CPU_REQUEST = StateKey("CPUOrchestration/request", CPURequest)


def compile_cpu_request(workload: Workload) -> CPURequest:
    """Compile `workload` (ValueError listing the valid values on a bad annotation)."""
    spec = workload.resource_spec
    raw = _annotation(workload, ANNOTATION_RESOURCE_SPEC)
    required = spec.required_cpu_bind_policy or raw.get("requiredCPUBindPolicy") or ""
    preferred = spec.preferred_cpu_bind_policy or raw.get("preferredCPUBindPolicy") or ""
    exclusive_policy = spec.preferred_cpu_exclusive_policy or raw.get("preferredCPUExclusivePolicy") or ""
    for kind, value, valid in (
        ("requiredCPUBindPolicy", required, POD_BIND_POLICIES),
        ("preferredCPUBindPolicy", preferred, POD_BIND_POLICIES),
        ("preferredCPUExclusivePolicy", exclusive_policy, POD_EXCLUSIVE_POLICIES),
    ):
        if value:
            check_choice(kind, value, valid)
    numa = workload.numa_topology_policy or _annotation(workload, ANNOTATION_NUMA_TOPOLOGY_SPEC).get(
        "numaTopologyPolicy", ""
    )
    check_choice("numaTopologyPolicy", numa, POD_NUMA_POLICIES)
    cpu = workload.requests.get(CPU, 0)
    qos = workload.qos or "LS"
    return CPURequest(
        cpu_milli=cpu,
        cpu_limit_milli=workload.limits.get(CPU, cpu),
        memory=workload.requests.get(MEMORY, 0),
        qos=qos,
        exclusive=qos in EXCLUSIVE_QOS,
        static_exclusive=qos == "LS" and workload.k8s_qos == "Guaranteed" and cpu > 0 and cpu % 1000 == 0,
        required_bind="" if required == "Default" else required,
        preferred_bind="" if preferred == "Default" else preferred,
        exclusive_policy="" if exclusive_policy == "Default" else exclusive_policy,
        numa_policy="" if numa == "None" else numa,
    )


def cpu_request(cycle: CycleState, workload: Workload, shape: Hashable | None = None) -> CPURequest:
    """The cycle's compiled request, compiling and storing it on first use.

    Compiled requests are memoized by the workload's request shape (sched/memo.py: everything
    but identity; pass it when known), since replicas and job tasks repeat the same shape; a
    bad annotation raises ValueError every time.
    """
    request = cycle.get(CPU_REQUEST)
    if request is None:
        shape = request_shape(workload) if shape is None else shape
        request = _COMPILED.get(shape)
        if request is None:
            request = compile_cpu_request(workload)
            if len(_COMPILED) >= _COMPILED_LIMIT:
                _COMPILED.clear()
            _COMPILED[shape] = request
        cycle.write(CPU_REQUEST, request)
    return request


_COMPILED: dict[Hashable, CPURequest] = {}
_COMPILED_LIMIT = 4096


def _annotation(workload: Workload, key: str) -> dict[str, str]:
    text = workload.annotations.get(key)
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"annotation {key} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"annotation {key} must be a JSON object, got {type(value).__name__}")
    return {str(k): str(v) for k, v in value.items()}


@dataclass(frozen=True, slots=True)
class CPUOffer:
    """The CPU decision on one node: an exclusive cpuset, or the NUMA shared pools of an LS workload."""

    node: int
    cpuset: CPUSet
    exclusive_policy: str
    numa_cpu: tuple[tuple[int, int], ...]  # (NUMA id, millicores) of the cpuset
    shared_pools: tuple[tuple[int, int], ...]  # (socket id, NUMA id)


CPU_OFFER = StateKey("CPUOrchestration/offer", CPUOffer)


@dataclass(frozen=True, slots=True)
class NUMAOffer:
    """Per-NUMA amounts this plugin grants on one node: {NUMA id: {resource: amount}}."""

    node: int
    grants: tuple[tuple[int, tuple[tuple[str, int], ...]], ...]

    def as_dict(self) -> dict[int, dict[str, int]]:
        return {n: dict(g) for n, g in self.grants}


NUMA_OFFER = StateKey("NUMAAlign/offer", NUMAOffer)
