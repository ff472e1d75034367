"""What a workload asks for: resources, QoS, CPU and NUMA policies, devices, placement, gang.

QoS (seed S3.1): Koordinator's classes LSE, LSR, LS and BE. When a workload names none, it is
derived from requests and limits the way Kubernetes derives its own class, then mapped as the
seed says: BestEffort -> BE, Burstable -> LS, and a new Guaranteed workload -> LS too (S3.1 rule
8); kubelet-static nodes still give Guaranteed workloads with whole CPUs an exclusive cpuset,
which is why `k8s_qos` is kept beside `qos`. LSE and LSR must have request == limit and whole
CPUs (S3.1), or they are rejected here, before they reach a queue.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, PositiveInt, model_validator

from finesched.model.base import FrozenDict, FrozenStrDict, Loc, Model, raise_problems
from finesched.model.gpu_partitions import ALLOCATE_POLICIES, ANNOTATION_GPU_PARTITION_SPEC, GPUPartitionSpec
from finesched.model.mig import MIG_RESOURCE_PREFIX, mig_profile_of
from finesched.model.names import NamespaceName, ObjectName
from finesched.model.resources import CPU, DEVICE_RESOURCE_NAMES, FPGA, MEMORY, RDMA, ResourceVector, canonical_name
from finesched.model.topology import GangTopology

QoS = Literal["LSE", "LSR", "LS", "BE"]
#: QoS classes whose workloads own their CPUs (an exclusive cpuset; Koordinator's LSE and LSR).
EXCLUSIVE_QOS = frozenset({"LSE", "LSR"})
K8sQoS = Literal["Guaranteed", "Burstable", "BestEffort"]
CPUBindPolicy = Literal["Default", "FullPCPUs", "SpreadByPCPUs", "ConstrainedBurst"]
CPUExclusivePolicy = Literal["None", "PCPULevel", "NUMANodeLevel"]
NUMATopologyPolicy = Literal["None", "BestEffort", "Restricted", "SingleNUMANode"]
DeviceAllocateStrategy = Literal["LeastAllocated", "MostAllocated"]
JointScope = Literal["SamePCIe", "SameNUMA"]
#: Priorities are 32-bit integers, as Kubernetes' PriorityClass values are.
MAX_INT32 = 2**31 - 1
MIN_PRIORITY, MAX_PRIORITY = -(2**31), MAX_INT32


class ResourceSpec(Model):
    """Koordinator's per-workload CPU policy (``scheduling.koordinator.sh/resource-spec``, S3.4-S3.5)."""

    required_cpu_bind_policy: CPUBindPolicy | None = Field(default=None, alias="requiredCPUBindPolicy")
    preferred_cpu_bind_policy: CPUBindPolicy | None = Field(default=None, alias="preferredCPUBindPolicy")
    preferred_cpu_exclusive_policy: CPUExclusivePolicy | None = Field(default=None, alias="preferredCPUExclusivePolicy")


class DeviceJointAllocate(Model):
    """Ask for devices of several types close to each other (S1.8), e.g. GPU + RDMA on one PCIe switch."""

    device_types: tuple[str, ...] = Field(min_length=2)
    required_scope: JointScope = "SamePCIe"


class NodeAffinityTerm(Model):
    """One required label expression (Kubernetes nodeAffinity matchExpressions); all terms must hold."""

    # The rule below as the OpenAPI document states it: In/NotIn need a value, Exists/DoesNotExist none.
    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {"properties": {"operator": {"enum": ["In", "NotIn"]}, "values": {"minItems": 1}},
                 "required": ["values"]},
                {"properties": {"operator": {"enum": ["Exists", "DoesNotExist"]}, "values": {"maxItems": 0}}},
            ]
        }
    )  # fmt: skip

    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _values_match_operator(self) -> NodeAffinityTerm:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self


HintAllocateStrategy = Literal["ApplyForAll", "RequestsAsCount"]
HintTopologyScope = Literal["Device", "PCIe", "NUMANode", "Node"]
HintExclusivePolicy = Literal["DeviceLevel", "PCIeLevel"]


class DeviceLabelSelector(Model):
    """A Kubernetes LabelSelector over device labels: every matchLabels pair and expression must hold."""

    match_labels: FrozenStrDict = Field(default_factory=FrozenDict)
    match_expressions: tuple[NodeAffinityTerm, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when `labels` satisfy the selector (an empty selector matches every device)."""
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for term in self.match_expressions:
            has = term.key in labels
            if term.operator == "In" and (not has or labels[term.key] not in term.values):
                return False
            if term.operator == "NotIn" and has and labels[term.key] in term.values:
                return False
            if (term.operator == "Exists") != has and term.operator in ("Exists", "DoesNotExist"):
                return False
        return True


#: The schema of a selector with nothing in it (``{}``; its fields empty or left out).
_EMPTY_SELECTOR: dict[str, Any] = {
    "anyOf": [
        {"type": "null"},
        {"type": "object", "additionalProperties": False,
         "properties": {"matchLabels": {"type": "object", "maxProperties": 0},
                        "matchExpressions": {"type": "array", "maxItems": 0}}},
    ]
}  # fmt: skip


class DeviceHint(Model):
    """How one device type of a workload is chosen (Koordinator's device-allocate-hint entry).

    * ``selector``: only devices whose labels match may be allocated;
    * ``allocateStrategy``: RequestsAsCount reads the request as a device count (rdma: 2 -> two
      whole devices); ApplyForAll gives the per-device request on every matching device of the node;
    * ``requiredTopologyScope``: all the type's devices within one PCIe switch / NUMA node
      (Device and Node add nothing: one node is always one scope);
    * ``exclusivePolicy``: DeviceLevel takes only unused devices and grants each whole, so no other
      workload shares them; PCIeLevel takes devices only on PCIe switches where no device of the
      type is in use.

    ``vfSelector`` is accepted only empty: finesched does not model SR-IOV virtual functions, so a
    non-empty one could not be honoured and is rejected rather than silently ignored.
    """

    selector: DeviceLabelSelector | None = None
    #: Only empty (below), as the OpenAPI document states it.
    vf_selector: DeviceLabelSelector | None = Field(default=None, alias="vfSelector", json_schema_extra=_EMPTY_SELECTOR)
    allocate_strategy: HintAllocateStrategy | None = None
    required_topology_scope: HintTopologyScope | None = None
    exclusive_policy: HintExclusivePolicy | None = None

    @model_validator(mode="after")
    def _no_vfs(self) -> DeviceHint:
        if self.vf_selector is not None and not self.vf_selector.empty:
            problem = "finesched does not model virtual functions; only an empty vfSelector ({}) is accepted"
            raise_problems([(("vfSelector",), problem, self.vf_selector.model_dump(by_alias=True))], "DeviceHint")
        return self


class DeviceHints(dict[str, DeviceHint]):
    """Device type -> DeviceHint, read-only and hashable (request shapes and memo keys hold it)."""

    __slots__ = ()

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def _refuse(self, *args: object, **kwargs: object) -> typing.NoReturn:
        raise TypeError("this mapping is read-only; build a new object with model_copy(update=...)")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]

    def __reduce__(self) -> tuple[object, ...]:
        return (DeviceHints, (dict(self),))


def _hints(value: dict[str, DeviceHint]) -> DeviceHints:
    return value if isinstance(value, DeviceHints) else DeviceHints(value)


#: Koordinator's scheduling annotations: JSON objects whose policy fields we read (other fields are
#: Koordinator's own and pass through). Checked here so a typo is reported when the manifest is
#: loaded, with the annotation as its path, not when the workload is first scheduled.
KOORDINATOR_ANNOTATION_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "scheduling.koordinator.sh/resource-spec": {
        "requiredCPUBindPolicy": typing.get_args(CPUBindPolicy),
        "preferredCPUBindPolicy": typing.get_args(CPUBindPolicy),
        "preferredCPUExclusivePolicy": ("Default", *typing.get_args(CPUExclusivePolicy)),
    },
    "scheduling.koordinator.sh/numa-topology-spec": {"numaTopologyPolicy": typing.get_args(NUMATopologyPolicy)},
    ANNOTATION_GPU_PARTITION_SPEC: {"allocatePolicy": ALLOCATE_POLICIES},
}


def _annotation_problems(annotations: dict[str, str]) -> list[tuple[Loc, str, object]]:
    problems: list[tuple[Loc, str, object]] = []
    for key, fields in KOORDINATOR_ANNOTATION_FIELDS.items():
        text = annotations.get(key)
        if not text:
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            problems.append((("annotations", key), f"is not JSON ({exc.msg} at column {exc.colno})", text))
            continue
        if not isinstance(value, dict):
            problems.append((("annotations", key), "must be a JSON object", text))
            continue
        for field, valid in fields.items():
            given = value.get(field)
            if given not in (None, "") and given not in valid:  # "" means unset, as in Koordinator
                problems.append((("annotations", key, field), f"is not one of {', '.join(valid)}", given))
    return problems


_GPU_NAMES = DEVICE_RESOURCE_NAMES - {RDMA, FPGA}


def _mig_problems(requests: ResourceVector) -> list[tuple[Loc, str, object]]:
    """MIG requests name a profile (``nvidia.com/mig-3g.40gb``) and never mix with GPU shares or
    whole GPUs: a card is either MIG or shared in software, never both."""
    problems: list[tuple[Loc, str, object]] = []
    mig = [name for name in requests if name.startswith(MIG_RESOURCE_PREFIX)]
    for name in mig:
        if mig_profile_of(name) is None:
            rule = "is not a MIG profile: nvidia.com/mig-<compute>g.<memory>gb[.me], e.g. nvidia.com/mig-3g.40gb"
            problems.append((("requests", name), rule, requests[name]))
    gpu = sorted(n for n in requests if canonical_name(n) in _GPU_NAMES and requests[n] > 0)
    if mig and gpu:
        rule = f"a workload asks for MIG instances or for GPUs {gpu}, not both (a card is MIG or shared, never both)"
        problems.append((("requests", mig[0]), rule, requests[mig[0]]))
    return problems


class Gang(Model):
    """All-or-nothing group: `min_member` workloads of the gang are placed together or none is.

    `topology`: the network domain its members must (or should) share (model/topology.py); members
    are ordered by name, numbers compared as numbers (w-2 before w-10), so ranks that talk most
    sit together."""

    name: str = Field(min_length=1)
    min_member: PositiveInt = Field(default=1, le=MAX_INT32)
    topology: GangTopology | None = None

    @model_validator(mode="after")
    def _slices(self) -> Gang:
        sliced = self.topology.slice if self.topology is not None else None
        if sliced is not None and self.min_member % sliced.size:
            rule = f"must divide minMember ({self.min_member}): the gang is cut into whole slices"
            raise_problems([(("topology", "slice", "size"), rule, sliced.size)], "gang")
        return self


PreemptionPolicy = Literal["PreemptLowerPriority", "Never"]
#: What happens when the workload's process fails (exits non-zero): Never leaves it Failed;
#: OnFailure starts it again on its node after a backoff, up to `backoffLimit` times (Kubernetes'
#: Pod restartPolicy and Job backoffLimit; Always is not offered: a workload may end).
RestartPolicy = Literal["Never", "OnFailure"]
DEFAULT_BACKOFF_LIMIT = 6  # Kubernetes Job's default


class DisruptionBudget(Model):
    """How many workloads of a group must stay bound when others are preempted (a PodDisruptionBudget).

    The group is the bound workloads whose labels match `selector` (in this workload's
    namespace), or, with no selector, this workload's gang (or the workload alone). Preemption
    prefers victims that leave every group at or above `min_available` (plugins/preemption.py).
    """

    min_available: int = Field(ge=0, le=MAX_INT32)
    selector: FrozenStrDict = Field(default_factory=FrozenDict)


class Migration(Model):
    """Whether the defragmenter may move the workload while it runs (opt in, as HAMi's and
    Volcano's users ask): its process is stopped and started again on the target the
    defragmenter reserved for it, so the work done since it started is lost."""

    allowed: bool = False


class Workload(Model):
    """A schedulable unit (a pod, a service instance, a dataflow slot).

    `preemption_policy` Never: the workload waits instead of preempting others (it can still be a
    victim). `disruption_budget`: see DisruptionBudget. `migration`: see Migration.
    `restart_policy` / `backoff_limit`: see RestartPolicy.
    """

    name: ObjectName
    namespace: NamespaceName = "default"
    labels: FrozenStrDict = Field(default_factory=FrozenDict)
    annotations: FrozenStrDict = Field(default_factory=FrozenDict)
    #: The tenant charged; default: the tenant that owns the namespace (the namespace's own name).
    tenant: str = ""
    priority: int = Field(default=0, ge=MIN_PRIORITY, le=MAX_PRIORITY)
    #: The PriorityClass whose value and preemption policy the workload gets (admission resolves it;
    #: a tenant may name only the classes its Tenant lists).
    priority_class_name: ObjectName | None = None
    qos: QoS | None = None
    requests: ResourceVector = Field(default_factory=ResourceVector)
    limits: ResourceVector = Field(default_factory=ResourceVector)
    resource_spec: ResourceSpec = Field(default_factory=ResourceSpec)
    numa_topology_policy: NUMATopologyPolicy | None = None
    device_allocate_strategy: DeviceAllocateStrategy | None = None
    device_joint_allocate: DeviceJointAllocate | None = None
    device_allocate_hint: typing.Annotated[dict[str, DeviceHint], AfterValidator(_hints)] = Field(
        default_factory=DeviceHints
    )
    #: Koordinator's gpu-partition-spec (model/gpu_partitions.py): keep to the nodes' GPU partition tables.
    gpu_partition_spec: GPUPartitionSpec | None = None
    node_selector: FrozenStrDict = Field(default_factory=FrozenDict)
    node_affinity: tuple[NodeAffinityTerm, ...] = ()
    gang: Gang | None = None
    preemption_policy: PreemptionPolicy = "PreemptLowerPriority"
    disruption_budget: DisruptionBudget | None = None
    #: `{allowed: true}`: the defragmenter may move it to make room for waiting work (sched/defrag.py).
    migration: Migration | None = None
    command: tuple[str, ...] = ()
    #: Appended to `command` by the node agent (Kubernetes' command/args split).
    args: tuple[str, ...] = ()
    env: FrozenStrDict = Field(default_factory=FrozenDict)
    restart_policy: RestartPolicy = "Never"
    backoff_limit: int = Field(default=DEFAULT_BACKOFF_LIMIT, ge=0, le=1000)

    @model_validator(mode="after")
    def _derive_and_check(self) -> Workload:
        # Kubernetes defaulting: a resource with a limit but no request requests its limit.
        missing = {k: v for k, v in self.limits.items() if k not in self.requests}
        if missing:
            object.__setattr__(self, "requests", self.requests + missing)
        if not self.tenant:
            object.__setattr__(self, "tenant", self.namespace)
        if self.qos is None:
            object.__setattr__(self, "qos", "BE" if self.k8s_qos == "BestEffort" else "LS")
        raise_problems(self._problems(), "Workload")
        return self

    def _problems(self) -> list[tuple[Loc, str, object]]:
        problems: list[tuple[Loc, str, object]] = []
        # Values are shown as the user writes them ("1500m", not 1500).
        shown, limits = self.requests.to_quantities(), self.limits.to_quantities()
        for name, text in limits.items():
            if self.limits[name] < self.requests.get(name, 0):
                problems.append((("limits", name), f"is below the request ({shown[name]})", text))
        if self.qos in EXCLUSIVE_QOS:
            cpu = self.requests.get(CPU, 0)
            if cpu <= 0 or cpu % 1000:
                rule = f"{self.qos} needs whole CPUs (a multiple of 1000m)"
                problems.append((("requests", CPU), rule, shown.get(CPU, "0")))
            for name in (CPU, MEMORY):
                if name in self.requests and self.limits.get(name) != self.requests[name]:
                    rule = f"{self.qos} needs limit == request ({shown[name]})"
                    problems.append((("limits", name), rule, limits.get(name)))
        problems += _annotation_problems(self.annotations)
        problems += _mig_problems(self.requests)
        return problems

    @property
    def movable(self) -> bool:
        """Whether the workload opted in to being moved by the defragmenter."""
        return self.migration is not None and self.migration.allowed

    @property
    def key(self) -> str:
        """The workload's unique key, ``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @property
    def k8s_qos(self) -> K8sQoS:
        """The Kubernetes QoS class these requests and limits give (one container)."""
        cpu_mem = (CPU, MEMORY)
        if not any(self.requests.get(n) or self.limits.get(n) for n in cpu_mem):
            return "BestEffort"
        if all(n in self.limits and self.limits[n] == self.requests.get(n) for n in cpu_mem):
            return "Guaranteed"
        return "Burstable"
