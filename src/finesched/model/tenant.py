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
"""

from __future__ import annotations

from pydantic import Field, model_validator

from finesched.model.base import Loc, Model, raise_problems
from finesched.model.names import NamespaceName, ObjectName, is_label
from finesched.model.resources import ResourceVector, translate_gpu_shortcuts

#: Weights are ratios between tenants: bounded so that a weighted share (share / weight) stays finite.
MIN_WEIGHT, MAX_WEIGHT = 0.001, 1_000_000.0


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
