"""A tenant: who shares the cluster, with what weight, within what quota (seed S4.5, DRF).

Two kinds of quota (sched/elastic.py applies them):

* `quota` — a hard cap on what the tenant may hold; it does not limit what others may take;
* `min` / `max` — an *elastic* quota: the tenant is guaranteed up to `min`; above `min` it may
  borrow up to `max`, but only from capacity that other tenants' `min` leaves unused right now,
  and what it borrows is reclaimed (its newest workloads preempted, even at equal priority)
  when a tenant under its `min` has work that fits nowhere.

`parent` puts tenants in a tree: a parent's `max` caps its whole subtree, and its `min` is the
subtree's guarantee. `namespaces` grants a tenant namespaces besides the one of its own name; each
namespace belongs to one tenant, whose tokens alone create and see objects there. Amounts are
written in the names users write (``nvidia.com/gpu`` counts whole GPUs and is translated to
gpu-core and gpu-memory-ratio, as requests are).

What only an admin sets, because it is what keeps tenants apart:

* `runAs` — the uid and gid the tenant's workloads run as on every node (Kubernetes'
  runAsUser/runAsGroup, Slurm's submitting user); root only with `allowRoot`. A tenant without
  one runs as a uid the node agent takes from its own range (HTCondor's slot users);
* `priorityClasses` — the PriorityClass names its workloads may name; the highest of their
  values is also the highest raw `priority` it may set;
* `limits` — how many objects it may hold (Kubernetes' ResourceQuota ``count/*``): workloads,
  jobs, and workloads waiting at once.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from finesched.model.base import Loc, Model, raise_problems
from finesched.model.names import NamespaceName, ObjectName, is_label
from finesched.model.resources import ResourceVector, translate_gpu_shortcuts

#: Weights are ratios between tenants: bounded so that a weighted share (share / weight) stays finite.
MIN_WEIGHT, MAX_WEIGHT = 0.001, 1_000_000.0
#: The largest uid or gid Linux gives out ((uid_t) -1 means "unchanged" to setresuid).
MAX_ID = 2**32 - 2
#: The largest object count a limit may name (a count, as Kubernetes' quantities of count/* are).
MAX_COUNT = 2**31 - 1


class RunAs(Model):
    """The user a tenant's processes run as: `uid`, `gid`, no supplementary groups. Root (uid or
    gid 0) only where the admin says so with `allowRoot`; every other uid runs without
    capabilities and with no_new_privs, so a setuid binary gives nothing back."""

    # The root rule as the OpenAPI document states it: uid and gid above 0, or allowRoot: true.
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"properties": {"uid": {"minimum": 1}, "gid": {"minimum": 1}}},
                {"properties": {"allowRoot": {"const": True}}, "required": ["allowRoot"]},
            ]
        }
    )

    uid: int = Field(ge=0, le=MAX_ID)
    gid: int = Field(ge=0, le=MAX_ID)
    allow_root: bool = False

    @model_validator(mode="after")
    def _root_is_explicit(self) -> RunAs:
        problems: list[tuple[Loc, str, object]] = []
        for name in ("uid", "gid"):
            if getattr(self, name) == 0 and not self.allow_root:
                problems.append(((name,), "is root: say allowRoot: true to run this tenant's workloads as root", 0))
        raise_problems(problems, "RunAs")
        return self

    @property
    def root(self) -> bool:
        return self.uid == 0


class ObjectLimits(Model):
    """How many objects a tenant may hold at once (Kubernetes' ResourceQuota ``count/*``): a write that
    would go over one is refused (403 "exceeded quota"), and nothing is stored. None: no limit."""

    workloads: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    jobs: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    #: Workloads Pending at once (a flood waits in its own tenant's queue, not everyone's).
    pending: int | None = Field(default=None, ge=0, le=MAX_COUNT)


class Tenant(Model):
    """Dominant Resource Fairness weighs tenants by `weight`; `quota` caps what they may hold at once.

    A workload whose tenant would go over quota (or over `max`, or borrow what others are
    guaranteed) waits in the queue; it does not fail.
    """

    name: ObjectName
    weight: float = Field(default=1.0, ge=MIN_WEIGHT, le=MAX_WEIGHT, allow_inf_nan=False)
    quota: ResourceVector | None = None
    min: ResourceVector | None = None
    max: ResourceVector | None = None
    parent: ObjectName | None = None
    #: Namespaces granted to this tenant besides the one of its own name (which it always owns
    #: when its name is a valid namespace): its tokens create and see objects only in these.
    namespaces: tuple[NamespaceName, ...] = ()
    run_as: RunAs | None = None
    #: The PriorityClasses this tenant's workloads may name (None and empty: none; the global
    #: default class applies to every tenant).
    priority_classes: tuple[ObjectName, ...] | None = None
    limits: ObjectLimits | None = None

    @model_validator(mode="after")
    def _min_within_max(self) -> Tenant:
        problems: list[tuple[Loc, str, object]] = []
        if self.parent == self.name:
            problems.append((("parent",), "a tenant cannot be its own parent", self.parent))
        seen: set[str] = set()
        for i, namespace in enumerate(self.namespaces):
            if namespace in seen:
                problems.append((("namespaces", i), "is listed twice", namespace))
            elif namespace == self.name:
                problems.append((("namespaces", i), "is the tenant's own namespace (owned without a grant)", namespace))
            seen.add(namespace)
        for i, name in enumerate(self.priority_classes or ()):
            if name in self.priority_classes[:i]:  # type: ignore[index]
                problems.append((("priorityClasses", i), "is listed twice", name))
        if self.min is not None and self.max is not None:
            low, high = translate_gpu_shortcuts(self.min), translate_gpu_shortcuts(self.max)
            shown = self.min.to_quantities()
            for name, amount in self.min.items():
                parts = translate_gpu_shortcuts({name: amount})
                over = [p for p in parts if p in high and low[p] > high[p]]
                if over:
                    limit = self.max.to_quantities().get(name, f"{over[0]}={high[over[0]]}")
                    problems.append((("min", name), f"is above max ({limit})", shown[name]))
        raise_problems(problems, "Tenant")
        return self

    @property
    def owned_namespaces(self) -> tuple[str, ...]:
        """The namespaces this tenant owns: its own name's (when that is a valid namespace) and its grants."""
        own = (self.name,) if is_label(self.name) else ()
        return own + tuple(n for n in self.namespaces if n != self.name)

    @property
    def elastic(self) -> bool:
        """Whether the tenant has an elastic quota (a `min` or a `max`)."""
        return self.min is not None or self.max is not None
