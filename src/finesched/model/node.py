"""What a node has: scalar resources, CPU topology, NUMA zones, devices and their links, policies.

Seeds: S0.1 (resource classes, 1-D and 2-D), S1.4-S1.5 (device inventory: uuid, minor, type,
health, resources per device, NUMA/PCIe placement), S1.8 (interconnect links), S3.3 (logical CPU
-> core, socket, NUMA node), S3.4/S3.6/S3.7 (node policies) and S3.8 (kubelet CPU manager).

A node is validated as a whole: device NUMA ids must exist in the node's topology, minors are
unique per device type, links and foreign allocations name devices that exist, foreign
allocations name dimensions their device has and together fit it, a GPU has at most 100 gpu-core
and gpu-memory-ratio, and the device-strategy label names a known strategy.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping
from functools import cached_property
from typing import ClassVar, Literal

from pydantic import Field, ModelWrapValidatorHandler, PositiveInt, field_validator, model_validator

from finesched.cpuset import MAX_CPU_ID, CPUSet
from finesched.model.base import FrozenDict, FrozenStrDict, Loc, Model, raise_problems
from finesched.model.gpu_partitions import (
    GPU_COUNT_PATTERN,
    LABEL_GPU_PARTITION_POLICY,
    PARTITION_POLICIES,
    GPUCount,
    GPUPartition,
    GPUPartitionPolicy,
    table_problems,
)
from finesched.model.mig import MIGSpec
from finesched.model.names import ObjectName
from finesched.model.resources import (
    CPU,
    GPU,
    GPU_CORE,
    GPU_MEMORY,
    GPU_MEMORY_RATIO,
    MEMORY,
    PODS,
    ByteQuantity,
    CPUQuantity,
    ResourceVector,
    resource_kind,
)
from finesched.quantity import format_quantity

CPUBindPolicyLabel = Literal["None", "FullPCPUsOnly", "SpreadByPCPUs"]
NUMAAllocateStrategy = Literal["MostAllocated", "LeastAllocated", "DistributeEvenly"]
NUMATopologyPolicy = Literal["None", "BestEffort", "Restricted", "SingleNUMANode"]
DeviceAllocateStrategy = Literal["LeastAllocated", "MostAllocated"]
KubeletCPUManagerPolicy = Literal["none", "static"]
DEFAULT_MAX_PODS = 110
#: Linux numbers NUMA nodes below 1024 (CONFIG_NODES_SHIFT <= 10) and device minors in 20 bits.
MAX_NUMA_ID = 1023
MAX_DEVICE_MINOR = 2**20 - 1
#: Node label naming the card-level device strategy when ``policies.deviceAllocateStrategy`` does not.
STRATEGY_LABEL = "finesched.io/device-allocate-strategy"
DEVICE_STRATEGIES = ("LeastAllocated", "MostAllocated")
#: Koordinator's node policy labels and their values (state/cpu_config.py reads them). A NUMA
#: topology policy may carry a PodLevel/ContainerLevel suffix; "" means unset.
LABEL_CPU_BIND_POLICY = "node.koordinator.sh/cpu-bind-policy"
LABEL_NUMA_ALLOCATE_STRATEGY = "node.koordinator.sh/numa-allocate-strategy"
LABEL_NUMA_TOPOLOGY_POLICY = "node.koordinator.sh/numa-topology-policy"
LABEL_NUMA_TOPOLOGY_POLICY_OLD = "node.koordinator.sh/numa-topology-alignment-policy"
NODE_BIND_POLICIES = ("None", "FullPCPUsOnly", "SpreadByPCPUs")
NODE_NUMA_STRATEGIES = ("MostAllocated", "LeastAllocated", "DistributeEvenly")
NUMA_POLICIES = ("None", "BestEffort", "Restricted", "SingleNUMANode")
NUMA_POLICY_SUFFIXES = ("PodLevel", "ContainerLevel")
_POLICY_LABELS = {
    LABEL_CPU_BIND_POLICY: NODE_BIND_POLICIES,
    LABEL_NUMA_ALLOCATE_STRATEGY: NODE_NUMA_STRATEGIES,
    LABEL_NUMA_TOPOLOGY_POLICY: NUMA_POLICIES,
    LABEL_NUMA_TOPOLOGY_POLICY_OLD: NUMA_POLICIES,
    LABEL_GPU_PARTITION_POLICY: PARTITION_POLICIES,
}


def numa_policy_of(value: str) -> str:
    """A NUMA topology policy label's value without its PodLevel/ContainerLevel suffix."""
    for suffix in NUMA_POLICY_SUFFIXES:
        if value.endswith(suffix) and value[: -len(suffix)] in NUMA_POLICIES:
            return value[: -len(suffix)]
    return value


#: Per-GPU percentage dimensions: 100 is one whole GPU, so a card never has more.
_GPU_PERCENT = (GPU_CORE, GPU_MEMORY_RATIO)

#: The kubelet CPU manager static-policy options finesched understands (S3.8).
KUBELET_CPU_OPTIONS = frozenset(
    {"full-pcpus-only", "distribute-cpus-across-numa", "align-by-socket", "distribute-cpus-across-cores"}
)


class CPUInfo(Model):
    """One logical CPU (a hardware thread) and where it sits (S3.3). Core ids are machine-unique."""

    id: int = Field(ge=0, le=MAX_CPU_ID)
    core: int = Field(ge=0, le=MAX_CPU_ID)
    socket: int = Field(ge=0, le=MAX_CPU_ID)
    numa: int = Field(ge=0, le=MAX_NUMA_ID)


class CPUTopology(Model):
    """The logical CPUs of a node, either listed or built from a regular shape.

    The builder form ``{sockets, numaPerSocket, coresPerNuma, threadsPerCore}`` numbers CPUs the
    way Linux does on common x86 servers: the first thread of every core gets ids 0..C-1, the
    second threads C..2C-1, and so on; core and NUMA ids are global. So with 2 sockets x 1 NUMA x
    32 cores x 2 threads, CPU 0 and CPU 64 are the two threads of core 0 on socket 0.
    """

    cpus: tuple[CPUInfo, ...]
    #: Every field a manifest may write here: the list form and the builder form's fields.
    MANIFEST_FIELDS: ClassVar[tuple[str, ...]] = ("cpus", "sockets", "numaPerSocket", "coresPerNuma", "threadsPerCore")

    @model_validator(mode="wrap")
    @classmethod
    def _cached(cls, data: object, handler: ModelWrapValidatorHandler[CPUTopology]) -> CPUTopology:
        # A cluster has a handful of distinct topologies and thousands of nodes: validating each
        # node's explicit CPU list (128 entries on a 2-socket server) was most of the CPU time of
        # the server's state rebuild at start-up. The value is immutable (frozen models in a
        # tuple), so nodes with the same topology share one; a failure is not cached (its error
        # is made afresh, so it is the same text).
        key = _topology_key(data)
        if key is None:
            return handler(_expand_builder(data))
        found = _TOPOLOGIES.get(key)
        if found is None:
            found = handler(_expand_builder(data))
            if len(_TOPOLOGIES) >= _TOPOLOGIES_KEPT:
                _TOPOLOGIES.pop(next(iter(_TOPOLOGIES)), None)  # the oldest; a rare stranger costs one validation
            _TOPOLOGIES[key] = found
        return found

    @field_validator("cpus")
    @classmethod
    def _check_cpus(cls, cpus: tuple[CPUInfo, ...]) -> tuple[CPUInfo, ...]:
        problems: list[tuple[Loc, str, object]] = []
        ids: set[int] = set()
        where: dict[int, tuple[int, int]] = {}
        for i, cpu in enumerate(cpus):
            if cpu.id in ids:
                problems.append(((i, "id"), "duplicate CPU id: each logical CPU appears once", cpu.id))
            ids.add(cpu.id)
            seen = where.setdefault(cpu.core, (cpu.socket, cpu.numa))
            if seen != (cpu.socket, cpu.numa):
                rule = f"core {cpu.core} is also on socket {seen[0]} numa {seen[1]}: a core's threads share both"
                problems.append(((i, "core"), rule, cpu.core))
        raise_problems(problems, "CPUTopology")
        return tuple(sorted(cpus, key=lambda c: c.id))

    @classmethod
    def from_list(cls, cpus: list[dict[str, int]]) -> CPUTopology:
        return cls.model_validate({"cpus": cpus})

    @cached_property
    def numa_ids(self) -> tuple[int, ...]:
        return tuple(sorted({c.numa for c in self.cpus}))

    @cached_property
    def socket_ids(self) -> tuple[int, ...]:
        return tuple(sorted({c.socket for c in self.cpus}))

    @cached_property
    def all_cpus(self) -> CPUSet:
        return CPUSet(c.id for c in self.cpus)


def _expand_builder(data: object) -> object:
    """What CPUTopology validates: the builder form expanded to its CPU list. This is validated as
    Python data, strictly when the manifest is (a list is then not a tuple): the CPU list is handed
    on as the tuple the field holds."""
    if isinstance(data, dict) and "cpus" not in data and data:
        return {"cpus": tuple(_build_cpus(data))}  # unknown builder fields are named by _TopologyShape
    if isinstance(data, dict) and isinstance(data.get("cpus"), list):
        return {**data, "cpus": tuple(data["cpus"])}
    return data


#: Validated topologies by `_topology_key` (insertion order: the oldest is dropped first).
_TOPOLOGIES: dict[tuple[object, ...], CPUTopology] = {}
_TOPOLOGIES_KEPT = 256
_CPU_FIELDS = operator.itemgetter("id", "core", "socket", "numa")
_SHAPE_FIELDS = frozenset(
    {
        "sockets",
        "numaPerSocket",
        "coresPerNuma",
        "threadsPerCore",
        "numa_per_socket",
        "cores_per_numa",
        "threads_per_core",
    }
)


def _topology_key(data: object) -> tuple[object, ...] | None:
    """The exact content of a topology's input when it is plain ints in the expected places, so
    that any validation mode (JSON or Python, strict or lax) gives the same result for it; None
    (not cached) for anything else: other types, missing or extra fields, a model instance."""
    if type(data) is not dict or not data:
        return None
    if data.keys() == {"cpus"}:
        cpus = data["cpus"]
        if type(cpus) is not list and type(cpus) is not tuple:
            return None
        # Checked with C loops (map, set): this runs for every node of a rebuild.
        if set(map(type, cpus)) != {dict} or set(map(len, cpus)) != {4}:
            return None
        try:
            rows = tuple(map(_CPU_FIELDS, cpus))
        except KeyError:
            return None
        if set(map(type, itertools.chain.from_iterable(rows))) != {int}:
            return None
        return ("cpus", rows)
    if data.keys() <= _SHAPE_FIELDS and all(type(v) is int for v in data.values()):
        return ("shape", tuple(sorted(data.items())))
    return None


class _TopologyShape(Model):
    sockets: PositiveInt
    numa_per_socket: PositiveInt = 1
    cores_per_numa: PositiveInt
    threads_per_core: PositiveInt = 1


def _build_cpus(data: dict[str, object]) -> list[dict[str, int]]:
    shape = _TopologyShape.model_validate(data)
    cores = shape.sockets * shape.numa_per_socket * shape.cores_per_numa
    if cores * shape.threads_per_core > MAX_CPU_ID + 1:
        # Checked before building: a typo such as coresPerNuma: 100000 must not build millions of CPUs.
        raise ValueError(
            f"sockets x numaPerSocket x coresPerNuma x threadsPerCore = {cores * shape.threads_per_core} "
            f"logical CPUs; at most {MAX_CPU_ID + 1}"
        )
    cpus = []
    for thread in range(shape.threads_per_core):
        for core in range(cores):
            numa = core // shape.cores_per_numa
            socket = numa // shape.numa_per_socket
            cpus.append({"id": thread * cores + core, "core": core, "socket": socket, "numa": numa})
    return cpus


class NUMAZone(Model):
    """A NUMA node's own capacity (S3.9 NodeResourceTopology zones)."""

    id: int = Field(ge=0, le=MAX_NUMA_ID)
    cpu: CPUQuantity | None = None
    memory: ByteQuantity | None = None


class Device(Model):
    """One device instance (S1.5). `resources` are its totals per dimension, canonical units.

    A GPU without explicit resources has gpu-core 100 and gpu-memory-ratio 100; any other type
    has 100 of its own name (one whole device), which is how new device types need no code
    (S1.4). gpu-memory in bytes is what makes a ratio request convertible on this card (S1.3).
    """

    type: str = Field(min_length=1, pattern=r"^[a-z0-9][-a-z0-9.]*$")
    minor: int = Field(ge=0, le=MAX_DEVICE_MINOR)
    uuid: str | None = None
    health: bool = True
    numa: int | None = Field(default=None, ge=0, le=MAX_NUMA_ID)
    pcie: str | None = None
    resources: ResourceVector = Field(default_factory=ResourceVector)
    #: What a workload's deviceAllocateHint selector matches (e.g. a NIC's role or a GPU's model).
    labels: FrozenStrDict = Field(default_factory=FrozenDict)
    #: A GPU in MIG mode (model/mig.py): handed out as MIG instances, never shared in software.
    mig: MIGSpec | None = None

    @model_validator(mode="after")
    def _default_resources(self) -> Device:
        if not self.resources:
            default = {GPU_CORE: 100, GPU_MEMORY_RATIO: 100} if self.type == GPU else {self.type: 100}
            object.__setattr__(self, "resources", ResourceVector(default))
        return self


def device_totals(device: Device) -> dict[str, int]:
    """A device's total per dimension: its resources, and for a GPU core and ratio 100 unless given."""
    totals = dict(device.resources)
    if device.type == GPU:  # a GPU is one whole GPU unless the manifest says otherwise
        totals.setdefault(GPU_CORE, 100)
        totals.setdefault(GPU_MEMORY_RATIO, 100)
    return totals


def foreign_amounts(kind: str, amounts: Mapping[str, int], totals: Mapping[str, int]) -> dict[str, int]:
    """What a foreign allocation takes on a device with `totals`: for a GPU the missing one of
    gpu-memory / gpu-memory-ratio is filled in per card (Koordinator's fill: bytes = ratio·total/100,
    ratio = ⌊bytes·100/total⌋), so ratio and bytes shares are counted against each other."""
    out = dict(amounts)
    memory = totals.get(GPU_MEMORY, 0)
    if kind != GPU or memory <= 0:
        return out
    if GPU_MEMORY_RATIO in out and GPU_MEMORY not in out:
        out[GPU_MEMORY] = out[GPU_MEMORY_RATIO] * memory // 100
    elif GPU_MEMORY in out and GPU_MEMORY_RATIO not in out:
        out[GPU_MEMORY_RATIO] = out[GPU_MEMORY] * 100 // memory
    return out


def _shown(name: str, amount: int) -> int | str:
    """An amount as the user wrote it: percentages and counts as numbers, bytes as "40Gi"."""
    kind = resource_kind(name)
    return amount if kind == "count" else format_quantity(amount, kind)


class DeviceLink(Model):
    """An interconnect between two devices of one type (S1.8), e.g. an NVLink between GPUs 0 and 1."""

    type: str = GPU
    a: int = Field(ge=0, le=MAX_DEVICE_MINOR)
    b: int = Field(ge=0, le=MAX_DEVICE_MINOR)
    kind: str = "NVLink"
    #: Bytes per second ("600G"); when given it ranks links for interconnect-aware choice.
    bandwidth: ByteQuantity | None = None

    @model_validator(mode="after")
    def _distinct(self) -> DeviceLink:
        if self.a == self.b:
            raise ValueError(f"a link joins two different devices, got a = b = {self.a}")
        return self


class ForeignAllocation(Model):
    """Amounts on a device already used by something outside finesched (S1.6); they count as used."""

    type: str
    minor: int = Field(ge=0, le=MAX_DEVICE_MINOR)
    resources: ResourceVector


class NodePolicies(Model):
    """Node-level policies (S3.4, S3.6, S3.7, S0.5). None means "not set here"."""

    cpu_bind_policy: CPUBindPolicyLabel | None = None
    numa_allocate_strategy: NUMAAllocateStrategy | None = None
    numa_topology_policy: NUMATopologyPolicy | None = None
    device_allocate_strategy: DeviceAllocateStrategy | None = None
    #: Koordinator's gpu-partition-policy (model/gpu_partitions.py); unset = its label, else Prefer.
    gpu_partition_policy: GPUPartitionPolicy | None = None


class KubeletPolicy(Model):
    """The kubelet CPU manager configuration of this node (S3.8)."""

    cpu_manager_policy: KubeletCPUManagerPolicy = "none"
    options: dict[str, bool] = Field(default_factory=dict)
    reserved_cpus: CPUSet = Field(default_factory=CPUSet, alias="reservedCPUs")

    @field_validator("options", mode="before")
    @classmethod
    def _options(cls, value: object) -> object:
        if not isinstance(value, dict):
            return value
        unknown = sorted(set(value) - KUBELET_CPU_OPTIONS)
        if unknown:
            raise ValueError(f"unknown kubelet CPU manager option(s) {unknown}; known: {sorted(KUBELET_CPU_OPTIONS)}")
        out = {}
        for key, flag in value.items():
            text = str(flag).lower()
            if text not in ("true", "false"):
                raise ValueError(f'option {key} must be "true" or "false", got {flag!r}')
            out[key] = text == "true"
        return out

    def option(self, name: str) -> bool:
        return self.options.get(name, False)


class Node(Model):
    """A node and everything it offers, as the scheduler sees it."""

    name: ObjectName
    labels: FrozenStrDict = Field(default_factory=FrozenDict)
    allocatable: ResourceVector = Field(default_factory=ResourceVector)
    cpu_topology: CPUTopology | None = None
    numa_zones: tuple[NUMAZone, ...] = ()
    devices: tuple[Device, ...] = ()
    links: tuple[DeviceLink, ...] = ()
    foreign_allocations: tuple[ForeignAllocation, ...] = ()
    #: GPU count -> the GPU sets allowed together (model/gpu_partitions.py), e.g. {2: [{minors: [0, 1]}]}.
    gpu_partitions: dict[GPUCount, tuple[GPUPartition, ...]] = Field(
        default_factory=dict, json_schema_extra={"propertyNames": {"pattern": GPU_COUNT_PATTERN}}
    )
    policies: NodePolicies = Field(default_factory=NodePolicies)
    kubelet: KubeletPolicy = Field(default_factory=KubeletPolicy)

    @model_validator(mode="after")
    def _consistent(self) -> Node:
        raise_problems([*self._device_problems(), *self._numa_problems()], "Node")
        self._derive_allocatable()
        return self

    def _device_problems(self) -> list[tuple[Loc, str, object]]:
        problems: list[tuple[Loc, str, object]] = []
        seen: set[tuple[str, int]] = set()
        for i, device in enumerate(self.devices):
            key = (device.type, device.minor)
            if key in seen:
                problems.append(
                    (
                        ("devices", i, "minor"),
                        f"duplicate {device.type} minor (minors are unique per type)",
                        device.minor,
                    )
                )
            seen.add(key)
        for i, link in enumerate(self.links):
            for end in ("a", "b"):
                minor = getattr(link, end)
                if (link.type, minor) not in seen:
                    problems.append((("links", i, end), f"no {link.type} device has this minor", minor))
        for i, device in enumerate(self.devices):
            if device.mig is not None and device.type != GPU:
                problems.append((("devices", i, "mig"), "only a gpu can be in MIG mode", device.type))
            if device.type != GPU:
                continue
            for name in _GPU_PERCENT:
                amount = device.resources.get(name, 0)
                if amount > 100:
                    rule = f"a GPU has at most 100 {name} (100 = one whole GPU)"
                    problems.append((("devices", i, "resources", name), rule, _shown(name, amount)))
        problems += self.foreign_problems()
        shared_gpus = {d.minor for d in self.devices if d.type == GPU and d.mig is None}
        for loc, rule, value in table_problems(self.gpu_partitions, shared_gpus):
            problems.append((("gpuPartitions", *loc), rule, value))
        label = self.labels.get(STRATEGY_LABEL)
        if label is not None and label not in DEVICE_STRATEGIES:
            rule = f"unknown device allocate strategy; allowed: {list(DEVICE_STRATEGIES)}"
            problems.append((("labels", STRATEGY_LABEL), rule, label))
        for key, valid in _POLICY_LABELS.items():
            value = self.labels.get(key)
            if value and (numa_policy_of(value) if valid is NUMA_POLICIES else value) not in valid:
                problems.append((("labels", key), f"is not one of {', '.join(valid)}", value))
        return problems

    def foreign_problems(self) -> list[tuple[Loc, str, object]]:
        """Foreign allocations must name existing devices and dimensions, and all of them together
        must fit each device: the accounts count them as used, and free below zero means nothing.

        Public so the device accounts can refuse a node built without validation (`model_construct`)
        instead of silently capping what it claims.
        """
        totals = {(d.type, d.minor): device_totals(d) for d in self.devices}
        mig = {(d.type, d.minor) for d in self.devices if d.mig is not None}
        problems: list[tuple[Loc, str, object]] = []
        used: dict[tuple[str, int, str], int] = {}
        for i, alloc in enumerate(self.foreign_allocations):
            have = totals.get((alloc.type, alloc.minor))
            if have is None:
                problems.append(
                    (("foreignAllocations", i, "minor"), f"no {alloc.type} device has this minor", alloc.minor)
                )
                continue
            if (alloc.type, alloc.minor) in mig:
                rule = f"{alloc.type} {alloc.minor} is in MIG mode: list what runs there as mig.instances"
                problems.append((("foreignAllocations", i, "minor"), rule, alloc.minor))
                continue
            where = f"{alloc.type} {alloc.minor}"
            for name, amount in alloc.resources.items():
                if have.get(name, 0) <= 0:
                    dims = sorted(n for n, t in have.items() if t > 0)
                    rule = f"{where} has no {name} (its dimensions: {dims})"
                    problems.append((("foreignAllocations", i, "resources", name), rule, _shown(name, amount)))
            blamed: set[str] = set()
            for name, amount in foreign_amounts(alloc.type, alloc.resources, have).items():
                key = (alloc.type, alloc.minor, name)
                before = used.get(key, 0)
                used[key] = before + amount
                total = have.get(name, 0)
                # a filled-in memory dimension is blamed on the one the entry gave
                given = name if name in alloc.resources else ({GPU_MEMORY, GPU_MEMORY_RATIO} - {name}).pop()
                if total > 0 and before <= total < before + amount and given not in blamed:
                    blamed.add(given)  # reported once, at the entry where the sum goes over
                    unit = resource_kind(name)
                    rule = (
                        f"foreign {name} on {where} adds up to {format_quantity(before + amount, unit)}, "
                        f"above the device's total {format_quantity(total, unit)}"
                    )
                    problems.append(
                        (("foreignAllocations", i, "resources", given), rule, _shown(given, alloc.resources[given]))
                    )
        return problems

    def _numa_problems(self) -> list[tuple[Loc, str, object]]:
        problems: list[tuple[Loc, str, object]] = []
        zone_ids: set[int] = set()
        for i, zone in enumerate(self.numa_zones):
            if zone.id in zone_ids:
                problems.append((("numaZones", i, "id"), "duplicate NUMA zone id", zone.id))
            zone_ids.add(zone.id)
            if self.cpu_topology is not None and zone.id not in self.cpu_topology.numa_ids:
                problems.append((("numaZones", i, "id"), "has no CPUs in cpuTopology", zone.id))
        known = self.numa_ids
        for i, device in enumerate(self.devices):
            if device.numa is not None and device.numa not in known:
                rule = (
                    f"is not a NUMA node of this node {list(known)}"
                    if known
                    else "given but the node declares no NUMA topology"
                )
                problems.append((("devices", i, "numa"), rule, device.numa))
        if self.cpu_topology is not None:
            logical = len(self.cpu_topology.cpus)
            if self.allocatable.get(CPU, 0) > 1000 * logical:
                rule = f"exceeds the {logical} logical CPUs of cpuTopology"
                problems.append((("allocatable", CPU), rule, self.allocatable.to_quantities()[CPU]))
            stray = sorted(set(self.kubelet.reserved_cpus) - set(self.cpu_topology.all_cpus))
            if stray:
                problems.append(
                    (
                        ("kubelet", "reservedCPUs"),
                        f"CPUs {stray} are not in cpuTopology",
                        str(self.kubelet.reserved_cpus),
                    )
                )
        return problems

    def _derive_allocatable(self) -> None:
        """Fill what the manifest leaves out: cpu/memory from the topology and zones, and
        pods = 110 (the kubelet's default maxPods), since every workload takes one pod slot."""
        extra: dict[str, int] = {} if PODS in self.allocatable else {PODS: DEFAULT_MAX_PODS}
        if CPU not in self.allocatable and self.cpu_topology is not None:
            extra[CPU] = 1000 * len(self.cpu_topology.cpus)
        zone_memory = [z.memory for z in self.numa_zones]
        if MEMORY not in self.allocatable and zone_memory and None not in zone_memory:
            extra[MEMORY] = sum(m for m in zone_memory if m is not None)
        if extra:
            object.__setattr__(self, "allocatable", self.allocatable + extra)

    @property
    def numa_ids(self) -> tuple[int, ...]:
        """NUMA node ids declared by the CPU topology, else by the NUMA zones."""
        if self.cpu_topology is not None:
            return self.cpu_topology.numa_ids
        return tuple(sorted(z.id for z in self.numa_zones))

    def devices_of(self, kind: str) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.type == kind)

    @property
    def partition_policy(self) -> str:
        """Honor or Prefer: policies.gpuPartitionPolicy, else the Koordinator label, else Prefer."""
        return self.policies.gpu_partition_policy or self.labels.get(LABEL_GPU_PARTITION_POLICY) or "Prefer"
