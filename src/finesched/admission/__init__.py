"""Admission: the one set of rules every door applies before an object is stored or acted on.

`finesched validate`, `finesched submit` and every write of the API (nodes, workloads, tenants,
jobs, offers) call the functions here, so a manifest valid on the command line is valid for the
server and the other way round, and nothing the scheduler would later refuse is ever stored.
Admission is pure: the caller reads the existing objects it needs into a `World` (the tenants,
the device types the nodes define) and gets back the admitted object or a `ValidationError`
naming every bad field, with the manifest's field paths (``spec.requests``, ``metadata.name``).

The rules, beyond what the models check when a manifest is parsed (names as DNS-1123, ranges of
fields that have one):

* numbers: finite, integers within ±(2^53 - 1) (`admission.numbers`);
* a workload's device requests follow Koordinator's rules, by the scheduler's own normalization
  (`normalize_device_request`: ``gpu-core: 50`` alone and ``gpu-core: 150`` are refused here, not
  when scheduled), and its CPU policies compile (`compile_cpu_request`);
* references: a workload is charged to the tenant that owns its namespace, which must exist; a
  tenant's parent exists and the tree has no cycle (the scheduler's own `QuotaTree` check); a
  namespace belongs to one tenant; a job's slots are admitted as workloads;
* caps: a workload (or a job's slots together) asking more than its tenant's hard `quota`, or the
  `max` of its tenant or an ancestor, by itself is refused with `NotAllowed` (a 403, Kubernetes'
  "exceeded quota: ..."): nothing that is released could ever admit it, and it would only wait;
* topologies: a gang's (or a job's) `topology` names a Topology that exists and levels of it
  (`GangTopology.problems_in`); one deleted later leaves its gangs waiting (the scheduler says why);
* priorities (`admission.priority`): a workload's `priorityClassName` resolves to the class's
  value and preemption policy, at most one class is the global default, and a tenant's own token
  may use only the classes its Tenant lists (`NotAllowed`, a 403, otherwise).

Where the files checked by `finesched validate` are not the whole cluster, references to objects
they do not define are warnings (`World.strict=False`), not errors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import pydantic

from finesched.admission.numbers import MAX_SAFE_INTEGER, number_problems
from finesched.admission.priority import (
    NotAllowed,
    check_priority_allowed,
    priority_class_problems,
    resolve_priority,
)
from finesched.dataflow import CompiledJob, compile_job, gang_workloads
from finesched.dataflow.gang import topology_problems as slice_problems
from finesched.errors import ErrorDetail, ValidationError
from finesched.model.job import Job
from finesched.model.manifest import Manifests, Object
from finesched.model.node import Node
from finesched.model.priority_class import PriorityClass
from finesched.model.resources import translate_gpu_shortcuts
from finesched.model.tenant import Tenant
from finesched.model.topology import GangTopology, Topology
from finesched.model.workload import Workload
from finesched.plugins.cpu.request import compile_cpu_request
from finesched.plugins.deviceshare.request import InvalidDeviceRequest, normalize_device_request
from finesched.sched.elastic import QuotaTree

__all__ = [
    "DEFAULT_TENANT",
    "MAX_JOB_SLOTS",
    "MAX_SAFE_INTEGER",
    "OFFER_NAMESPACE",
    "RESERVED_NAMESPACES",
    "NotAllowed",
    "World",
    "admit_job",
    "admit_manifests",
    "admit_node",
    "admit_priority",
    "admit_priority_class",
    "admit_probe",
    "admit_tenant",
    "admit_workload",
    "check_caps",
    "number_problems",
    "sound_tenants",
    "topology_problems",
]

#: The tenant of the ``default`` namespace exists without being created (as Kubernetes' namespace does).
DEFAULT_TENANT = "default"
#: The namespace of the holds that keep offered resources (``finesched-offers/offer-<id>``).
OFFER_NAMESPACE = "finesched-offers"
#: Namespaces the control plane uses itself: no tenant owns them, no workload is submitted there.
RESERVED_NAMESPACES = frozenset({OFFER_NAMESPACE})
#: A job's slots are one gang placed in one request: as many as one submission may carry.
MAX_JOB_SLOTS = 1000


@dataclass(frozen=True)
class World:
    """The existing objects admission looks at (read by the caller: admission does no I/O).

    `tenants`: the tenants by name (an implicit ``default`` is added when absent);
    `device_types`: device types the nodes define besides gpu, rdma and fpga;
    `priority_classes`: the PriorityClasses by name;
    `topologies`: the Topologies by name (a gang's `topology` names one);
    `strict`: references to objects not in `tenants` (or `priority_classes`) are errors (the
    server) or warnings (`finesched validate` on files that are not the whole cluster).
    """

    tenants: Mapping[str, Tenant] = field(default_factory=dict)
    device_types: frozenset[str] = frozenset()
    priority_classes: Mapping[str, PriorityClass] = field(default_factory=dict)
    strict: bool = True
    topologies: Mapping[str, Topology] = field(default_factory=dict)
    #: Warnings collected when not strict: (where, path, message, value).
    warnings: list[ErrorDetail] = field(default_factory=list, compare=False)

    def tenant(self, name: str) -> Tenant | None:
        found = self.tenants.get(name)
        if found is None and name == DEFAULT_TENANT:
            return Tenant(name=DEFAULT_TENANT)
        return found

    @cached_property
    def _grants(self) -> dict[str, str]:
        return {ns: t.name for t in self.tenants.values() for ns in t.namespaces if ns != t.name}

    def owner(self, namespace: str) -> str | None:
        """The tenant that owns `namespace`: the one granting it, else the one of its name, else None."""
        granted = self._grants.get(namespace)
        if granted is not None:
            return granted
        return namespace if self.tenant(namespace) is not None else None

    @cached_property
    def quota_tree(self) -> QuotaTree:
        """The tenants' quotas as the scheduler applies them (those that form a sound tree)."""
        return QuotaTree(sound_tenants(self.tenants.values())[0])

    def with_tenant(self, tenant: Tenant) -> World:
        return replace(self, tenants={**self.tenants, tenant.name: tenant})

    def with_priority_class(self, cls: PriorityClass) -> World:
        return replace(self, priority_classes={**self.priority_classes, cls.name: cls})

    def with_topology(self, topology: Topology) -> World:
        return replace(self, topologies={**self.topologies, topology.name: topology})

    def missing(self, errors: list[ErrorDetail], detail: ErrorDetail) -> None:
        """A reference to an object this world does not hold: an error, or a warning when not strict."""
        (errors if self.strict else self.warnings).append(detail)


def _fail(errors: list[ErrorDetail]) -> None:
    if errors:
        raise ValidationError(errors)


def _numbers(obj: object, where: str) -> list[ErrorDetail]:
    return [ErrorDetail(f"spec.{path}", rule, value, where) for path, rule, value in number_problems(obj)]


# Workloads ------------------------------------------------------------------------------------------
def admit_workload(
    workload: Workload, world: World, *, where: str = "", as_tenant: bool = False, topology: bool = True
) -> Workload:
    """`workload` as it will be stored (its tenant resolved from its namespace, its priority from its
    PriorityClass), or ValidationError. `as_tenant`: submitted by its tenant's own token, so the
    tenant's PriorityClass rule applies (NotAllowed, before any ValidationError, when broken).
    `topology=False`: its gang's topology is checked by the caller (a job's, at ``spec.topology``)."""
    errors = _numbers(workload, where) + _request_problems(workload, world, where)
    if topology and workload.gang is not None and workload.gang.topology is not None:
        errors += topology_problems(workload.gang.topology, world, "spec.gang.topology", where)
    if workload.namespace in RESERVED_NAMESPACES:
        errors.append(ErrorDetail("metadata.namespace", "is reserved for the control plane", workload.namespace, where))
    else:
        workload = _resolve_tenant(workload, world, errors, where)
    if as_tenant:
        check_priority_allowed(workload, world.tenant(workload.tenant), world.priority_classes, where)
    workload = resolve_priority(workload, world.priority_classes, errors, world.missing, where)
    _fail(errors)
    check_caps(workload.tenant, [workload], world, where)
    return workload


def check_caps(tenant: str, workloads: Iterable[Workload], world: World, where: str = "") -> None:
    """Refuse (`NotAllowed`, a 403) what `tenant`'s caps can never admit: `workloads` placed together
    asking more than its hard `quota`, or than the `max` of it or of an ancestor (sched/elastic.py
    `never_admits`). Work that only does not fit in what is left now is admitted: it waits."""
    tree = world.quota_tree
    if tree.empty or tenant not in tree.names:
        return
    demand: dict[str, int] = {}
    for workload in workloads:
        for name, amount in translate_gpu_shortcuts(workload.requests).items():
            demand[name] = demand.get(name, 0) + amount
    problem = tree.never_admits(tenant, demand)
    if problem is not None:
        raise NotAllowed(
            ErrorDetail("", f"{problem} (no release can make room for it; ask an admin to raise it)", where=where)
        )


def topology_problems(asked: GangTopology, world: World, path: str, where: str = "") -> list[ErrorDetail]:
    """Why `asked` (a gang's topology, at `path`) does not fit the topologies of `world`: one that
    does not exist (an error, or a warning when `world` is not the whole cluster), a level that is
    not one of its levels, a slice level coarser than the gang's (errors)."""
    errors: list[ErrorDetail] = []
    topology = world.topologies.get(asked.name)
    if topology is None:
        rule = f"no Topology {asked.name} exists (known: {_names(world.topologies)})"
        world.missing(errors, ErrorDetail(f"{path}.name", rule, asked.name, where))
        return errors
    for loc, rule, value in asked.problems_in(topology):
        errors.append(ErrorDetail(".".join([path, *map(str, loc)]), rule, value, where))
    return errors


def admit_priority(workload: Workload, world: World, *, where: str = "") -> Workload:
    """`workload` with its PriorityClass resolved and nothing else checked (`finesched plan` on files,
    whose other rules the scheduler applies itself), or ValidationError."""
    errors: list[ErrorDetail] = []
    workload = resolve_priority(workload, world.priority_classes, errors, world.missing, where)
    _fail(errors)
    return workload


def admit_probe(probe: Workload, world: World, *, where: str = "") -> Workload:
    """A workload the control plane places for a tenant itself (an offer's hold): its requests and
    numbers are admitted like a workload's, its tenant must exist, its namespace is the system's."""
    errors = _numbers(probe, where) + _request_problems(probe, world, where)
    if world.tenant(probe.tenant) is None:
        world.missing(errors, ErrorDetail("tenant", f"tenant {probe.tenant} does not exist", probe.tenant, where))
    _fail(errors)
    return probe


def _request_problems(workload: Workload, world: World, where: str) -> list[ErrorDetail]:
    """The scheduler's own request rules (device normalization, CPU policies), checked now."""
    errors = []
    try:
        normalize_device_request(
            workload.requests,
            device_types=world.device_types,
            joint=workload.device_joint_allocate,
            hints=workload.device_allocate_hint,
        )
    except InvalidDeviceRequest as exc:
        errors.append(ErrorDetail("spec.requests", str(exc), dict(workload.requests.to_quantities()), where))
    try:
        compile_cpu_request(workload)
    except ValueError as exc:
        errors.append(ErrorDetail("spec", str(exc), where=where))
    return errors


def _resolve_tenant(workload: Workload, world: World, errors: list[ErrorDetail], where: str) -> Workload:
    """Charge the workload to its namespace's owner; refuse another tenant or a namespace nobody owns."""
    namespace = workload.namespace
    owner = world.owner(namespace)
    named = "tenant" in workload.model_fields_set and workload.tenant != namespace
    if owner is None:
        rule = (
            f"namespace {namespace} belongs to no tenant: create tenant {namespace}, or grant the namespace to a "
            "tenant (its spec.namespaces)"
        )
        world.missing(errors, ErrorDetail("metadata.namespace", rule, namespace, where))
        if named and world.tenant(workload.tenant) is None:
            rule = f"tenant {workload.tenant} does not exist"
            world.missing(errors, ErrorDetail("spec.tenant", rule, workload.tenant, where))
        return workload
    if named and workload.tenant != owner:
        rule = f"namespace {namespace} belongs to tenant {owner}; a workload is charged to its namespace's tenant"
        errors.append(ErrorDetail("spec.tenant", rule, workload.tenant, where))
        return workload
    if workload.tenant == owner:
        return workload
    return workload.model_copy(update={"tenant": owner})


# Tenants --------------------------------------------------------------------------------------------
def admit_tenant(tenant: Tenant, world: World, *, where: str = "") -> Tenant:
    """`tenant` if it may replace (or join) the tenants of `world`, else ValidationError."""
    errors = _numbers(tenant, where)
    others = {n: t for n, t in world.tenants.items() if n != tenant.name}
    if tenant.name in RESERVED_NAMESPACES or RESERVED_NAMESPACES & set(tenant.namespaces):
        rule = "names a namespace reserved for the control plane"
        errors.append(ErrorDetail("metadata.name", rule, tenant.name, where))
    for other in others.values():
        if tenant.name in other.namespaces and tenant.name in tenant.owned_namespaces:
            rule = f"namespace {tenant.name} is granted to tenant {other.name}; a tenant owns its own name's namespace"
            errors.append(ErrorDetail("metadata.name", rule, tenant.name, where))
        for i, namespace in enumerate(tenant.namespaces):
            if namespace in other.owned_namespaces:
                errors.append(ErrorDetail(f"spec.namespaces[{i}]", f"belongs to tenant {other.name}", namespace, where))
    if not world.strict:  # a class listed before it is created is allowed: it can be used once it exists
        for i, name in enumerate(tenant.priority_classes or ()):
            if name not in world.priority_classes:
                rule = f"no PriorityClass {name} exists (these files define: {_names(world.priority_classes)})"
                world.warnings.append(ErrorDetail(f"spec.priorityClasses[{i}]", rule, name, where))
    if tenant.parent is not None and tenant.parent not in others:
        rule = f"tenant {tenant.parent} does not exist"
        world.missing(errors, ErrorDetail("spec.parent", rule, tenant.parent, where))
    elif tenant.parent is not None:
        errors += _cycle_problems(tenant, world.tenants, where)
    _fail(errors)
    return tenant


def _names(objects: Mapping[str, object]) -> str:
    return ", ".join(sorted(objects)) or "none"


def _cycle_problems(tenant: Tenant, existing: Mapping[str, Tenant], where: str) -> list[ErrorDetail]:
    """The scheduler's own tree check (QuotaTree) on the tenants with this one in (or replaced): its
    parent chain must reach a root through sound tenants, without a cycle."""
    _, refused = sound_tenants([*(t for n, t in existing.items() if n != tenant.name), tenant])
    if tenant.name not in refused:
        return []
    _, before = sound_tenants(existing.values())
    parent = tenant.parent
    if parent in before:  # the parent itself is set aside (stored before these rules)
        rule = f"tenant {parent} cannot be a parent now ({before[parent]})"
    else:
        rule = refused[tenant.name].split(": ", 1)[1]
    return [ErrorDetail("spec.parent", rule, parent, where)]


def sound_tenants(tenants: Iterable[Tenant]) -> tuple[list[Tenant], dict[str, str]]:
    """The tenants that form a valid tree, and why each other one cannot join it (a parent that does
    not exist, a cycle): what the scheduler may be given when stored tenants are not all sound."""
    good = {t.name: t for t in tenants}
    refused: dict[str, str] = {}
    while True:
        try:
            QuotaTree(good.values())
            return list(good.values()), refused
        except ValidationError as exc:
            for error in exc.errors:
                name = error.where.removeprefix("tenant ")
                if name in good:
                    refused[name] = f"spec.parent {error.value}: {error.message}"
                    del good[name]


# Priority classes -----------------------------------------------------------------------------------
def admit_priority_class(cls: PriorityClass, world: World, *, where: str = "") -> PriorityClass:
    """`cls` if it may replace (or join) the classes of `world` (at most one global default), else
    ValidationError."""
    _fail(_numbers(cls, where) + priority_class_problems(cls, world.priority_classes, where))
    return cls


# Nodes and jobs -------------------------------------------------------------------------------------
def admit_node(node: Node, world: World, *, where: str = "") -> Node:
    _fail(_numbers(node, where))
    return node


def admit_job(
    job: Job, world: World, *, where: str = "", as_tenant: bool = False
) -> tuple[CompiledJob, list[Workload]]:
    """The compiled job (seed S2) and its slot workloads, each admitted as a workload (`as_tenant`:
    see `admit_workload`); or ValidationError."""
    _fail(_numbers(job, where))
    compiled = compile_job(job)  # CompileError (a ValidationError) names the job's fields
    if job.topology is not None:  # the slots' gang's, named where the job's manifest has it
        sliced = [replace(e, where=where) for e in slice_problems(job, compiled)]
        _fail(topology_problems(job.topology, world, "spec.topology", where) + sliced)
    if compiled.slots_needed > MAX_JOB_SLOTS:  # every slot is a workload of one gang, placed in one request
        rule = f"the job needs {compiled.slots_needed} slots; a job has at most {MAX_JOB_SLOTS}"
        _fail([ErrorDetail("spec.tasks", rule, where=where)])
    try:
        workloads = gang_workloads(job, compiled)
    except pydantic.ValidationError as exc:  # a slot name (<job>-<group>-<index>) longer than a name may be
        rule = f"is too long for its slot workloads' names ({exc.errors()[0]['msg']})"
        raise ValidationError([ErrorDetail("metadata.name", rule, job.name, where)]) from None
    errors: list[ErrorDetail] = []
    admitted = []
    for workload in workloads:
        try:
            admitted.append(admit_workload(workload, world, where=where, as_tenant=as_tenant, topology=False))
        except ValidationError as exc:
            errors += [e for e in exc.errors if e not in errors]
    _fail(errors)
    check_caps(admitted[0].tenant, admitted, world, where)  # the slots are one gang: placed together
    return compiled, admitted


# Files ----------------------------------------------------------------------------------------------
def admit_manifests(manifests: Manifests, known: World | None = None) -> tuple[Manifests, list[ErrorDetail]]:
    """Admit everything loaded from manifest files (`finesched validate`, `submit`): the objects as
    the server would store them, and warnings for references to what neither the files nor `known`
    (what a server said it holds: its tenants and PriorityClasses) define; ValidationError listing
    every problem of every file otherwise."""
    known = known or World()
    world = World(
        {**known.tenants, **{t.name: t for t in manifests.tenants}},
        frozenset(d.type for n in manifests.nodes for d in n.devices) | known.device_types,
        dict(known.priority_classes), strict=False, topologies=dict(known.topologies),
    )  # fmt: skip
    out = Manifests(origins=manifests.origins, yaml_nodes=manifests.yaml_nodes)
    errors: list[ErrorDetail] = []
    for topology in manifests.topologies:  # first: the gangs below may name them
        world = world.with_topology(topology)
        out.add(topology)
    for cls in manifests.priority_classes:  # each against those before it: a second default is the error
        try:
            admit_priority_class(cls, world, where=manifests.where(cls))
        except ValidationError as exc:
            errors += exc.errors
            continue
        world = world.with_priority_class(cls)
        out.add(cls)
    checks: list[tuple[Object, Any]] = [
        *((t, admit_tenant) for t in manifests.tenants),
        *((n, admit_node) for n in manifests.nodes),
        *((w, admit_workload) for w in manifests.workloads),
        *((j, admit_job) for j in manifests.jobs),
    ]
    for obj, admit in checks:
        try:
            admitted = admit(obj, world, where=manifests.where(obj))
        except ValidationError as exc:
            errors += exc.errors
            continue
        except NotAllowed as exc:  # a request its tenant's caps (defined in these files) never admit
            errors.append(exc.detail)
            continue
        out.add(obj if isinstance(obj, Job) else admitted)
    _fail(errors)
    unique = {(w.path, w.message, repr(w.value)): w for w in reversed(world.warnings)}  # the first of each
    return out, sorted(unique.values(), key=world.warnings.index)
