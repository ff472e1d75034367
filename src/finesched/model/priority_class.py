"""PriorityClass: a named priority an admin defines and tenants are allowed to use (Kubernetes'
scheduling.k8s.io/v1 PriorityClass).

Priorities decide who waits and who is preempted, so they belong to the admin: a workload names
a class (`priorityClassName`), admission resolves it to the class's `value` and
`preemptionPolicy`, and a tenant may name only the classes its Tenant lists
(`spec.priorityClasses`). At most one class is the `globalDefault`: a workload that names none
gets it. A class is cluster-scoped (no namespace), like a Kubernetes one.
"""

from __future__ import annotations

from pydantic import Field

from finesched.model.base import Model
from finesched.model.names import ObjectName
from finesched.model.workload import MAX_PRIORITY, MIN_PRIORITY, PreemptionPolicy

#: Longest description kept (Kubernetes sets none; a bound keeps a stored object small).
MAX_DESCRIPTION = 1024


class PriorityClass(Model):
    """`value`: the priority its workloads get (higher is placed first and may preempt lower);
    `preemption_policy` Never: its workloads wait instead of preempting (they can still be
    victims); `global_default`: the class of workloads that name none."""

    name: ObjectName
    value: int = Field(ge=MIN_PRIORITY, le=MAX_PRIORITY)
    global_default: bool = False
    preemption_policy: PreemptionPolicy = "PreemptLowerPriority"
    description: str = Field(default="", max_length=MAX_DESCRIPTION)
