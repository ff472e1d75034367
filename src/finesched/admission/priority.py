"""PriorityClass admission: a workload's priority comes from a class the admin defines, and a tenant
uses only the classes its Tenant lists (Kubernetes' Priority admission plugin, plus the tenant rule).

* A PriorityClass: at most one is the `globalDefault` (a second one is refused naming the first,
  as Kubernetes refuses it).
* A workload naming `priorityClassName` gets the class's `value` as its `priority` and the class's
  `preemptionPolicy`; giving another raw `priority` too is refused (Kubernetes' message). It may
  still say `preemptionPolicy: Never` under a class that preempts: waiting instead of evicting
  gives nothing away. A workload naming no class and no priority (0) gets the global default
  class when there is one. The stored workload keeps the class name and the resolved value, so a
  class changed later does not change the workloads admitted before (as in Kubernetes, where a
  pod's priority is fixed at admission).
* The tenant rule, applied when a tenant's own token submits (`as_tenant`): the class must be one
  its Tenant lists in `spec.priorityClasses`, or the global default; a raw `priority` may not be
  above the highest value of those classes (0 when it may use none). Breaking it is `NotAllowed`
  (HTTP 403), not a validation error: the manifest is valid, the caller may not ask for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from finesched.errors import ErrorDetail
from finesched.model.priority_class import PriorityClass
from finesched.model.tenant import Tenant
from finesched.model.workload import Workload

__all__ = [
    "NotAllowed",
    "allowed_classes",
    "check_priority_allowed",
    "global_default",
    "priority_class_problems",
    "priority_limit",
    "resolve_priority",
]

#: Appends a reference to something that does not exist: an error, or a warning (World.missing).
Missing = Callable[[list[ErrorDetail], ErrorDetail], None]


class NotAllowed(Exception):
    """A valid request the caller may not make (HTTP 403): `detail` says what and why."""

    def __init__(self, detail: ErrorDetail):
        self.detail = detail
        super().__init__(f"{detail.path}: {detail.message}" if detail.path else detail.message)


def global_default(classes: Mapping[str, PriorityClass]) -> PriorityClass | None:
    """The class of workloads that name none. Admission keeps at most one; were there several (two
    written at once by two replicas), the lowest value wins, as in Kubernetes."""
    defaults = [c for c in classes.values() if c.global_default]
    return min(defaults, key=lambda c: (c.value, c.name)) if defaults else None


def allowed_classes(tenant: Tenant | None, classes: Mapping[str, PriorityClass]) -> tuple[str, ...]:
    """The class names a tenant's workloads may name: its `spec.priorityClasses`, and the global default."""
    names = list(tenant.priority_classes or ()) if tenant is not None else []
    default = global_default(classes)
    if default is not None and default.name not in names:
        names.append(default.name)
    return tuple(names)


def priority_limit(tenant: Tenant | None, classes: Mapping[str, PriorityClass]) -> int:
    """The highest raw priority a tenant may set: the highest value among the classes it may use
    (those that exist), 0 when there are none."""
    return max((classes[n].value for n in allowed_classes(tenant, classes) if n in classes), default=0)


def _listed(names: tuple[str, ...]) -> str:
    return ", ".join(names) if names else "none"


def check_priority_allowed(
    workload: Workload, tenant: Tenant | None, classes: Mapping[str, PriorityClass], where: str = ""
) -> None:
    """The tenant rule for `workload` as its tenant's token submitted it; NotAllowed when broken."""
    name = workload.priority_class_name
    allowed = allowed_classes(tenant, classes)
    who = f"tenant {workload.tenant}"
    if name is not None:
        if name not in allowed:
            rule = f"{who} may not use PriorityClass {name} (it may use: {_listed(allowed)})"
            raise NotAllowed(ErrorDetail("spec.priorityClassName", rule, name, where))
        return
    limit = priority_limit(tenant, classes)
    if workload.priority > limit:
        usable = tuple(n for n in allowed if n in classes)
        why = f"the highest value of the PriorityClasses it may use: {', '.join(usable)}" if usable else (
            "it may use no PriorityClass")  # fmt: skip
        rule = f"is above the highest priority {who} may set, {limit} ({why}); name a PriorityClass instead"
        raise NotAllowed(ErrorDetail("spec.priority", rule, workload.priority, where))


def resolve_priority(
    workload: Workload,
    classes: Mapping[str, PriorityClass],
    errors: list[ErrorDetail],
    missing: Missing,
    where: str = "",
) -> Workload:
    """`workload` with its class's value and preemption policy (or the global default class when it
    names none and sets no priority); problems are appended to `errors` (or `missing`)."""
    name = workload.priority_class_name
    if name is None:
        default = global_default(classes)
        if default is None or workload.priority != 0:
            return workload  # a raw priority (the tenant rule bounds it), or none at all
        return _with_class(workload, default)
    found = classes.get(name)
    if found is None:
        rule = f"no PriorityClass {name} exists (known: {_listed(tuple(sorted(classes)))})"
        missing(errors, ErrorDetail("spec.priorityClassName", rule, name, where))
        return workload
    given = workload.model_fields_set
    if "priority" in given and workload.priority != found.value:
        rule = (
            f"the integer value of priority ({workload.priority}) must not be provided; it is computed from "
            f"PriorityClass {name} ({found.value})"
        )
        errors.append(ErrorDetail("spec.priority", rule, workload.priority, where))
    own = workload.preemption_policy
    if "preemption_policy" in given and own != found.preemption_policy and own != "Never":
        rule = (
            f"must not be {own}: PriorityClass {name} says {found.preemption_policy} (a workload may only "
            "choose Never, to wait instead of preempting)"
        )
        errors.append(ErrorDetail("spec.preemptionPolicy", rule, own, where))
    return _with_class(workload, found)


def _with_class(workload: Workload, found: PriorityClass) -> Workload:
    """The workload under `found`: its value, and its policy unless the workload chose Never itself."""
    keep_never = "preemption_policy" in workload.model_fields_set and workload.preemption_policy == "Never"
    update = {"priority_class_name": found.name, "priority": found.value,
              "preemption_policy": "Never" if keep_never else found.preemption_policy}  # fmt: skip
    if all(getattr(workload, k) == v for k, v in update.items()):
        return workload
    return workload.model_copy(update=update)


def priority_class_problems(
    cls: PriorityClass, classes: Mapping[str, PriorityClass], where: str = ""
) -> list[ErrorDetail]:
    """Why `cls` may not replace (or join) `classes`: at most one global default."""
    if not cls.global_default:
        return []
    other = next((c for n, c in sorted(classes.items()) if c.global_default and n != cls.name), None)
    if other is None:
        return []
    rule = f"PriorityClass {other.name} is already the global default; at most one class may be"
    return [ErrorDetail("spec.globalDefault", rule, True, where)]
