"""A tenant: who shares the cluster, with what weight, within what quota (seed S4.5, DRF).

Two kinds of quota (sched/elastic.py applies them):

* `quota` — a hard cap on what the tenant may hold; it does not limit what others may take;
* `min` / `max` — an *elastic* quota: the tenant is guaranteed up to `min`; above `min` it may
  borrow up to `max`, but only from capacity that other tenants' `min` leaves unused right now,
  and what it borrows is reclaimed (its newest workloads preempted, even at equal priority)
  when a tenant under its `min` has work that fits nowhere.

`parent` puts tenants in a tree: a parent's `max` caps its whole subtree, and its `min` is the
subtree's guarantee. Amounts are written in the names users write (``nvidia.com/gpu`` counts
whole GPUs and is translated to gpu-core and gpu-memory-ratio, as requests are).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from finesched.model.base import Loc, Model, raise_problems
from finesched.model.resources import ResourceVector, translate_gpu_shortcuts


class Tenant(Model):
    """Dominant Resource Fairness weighs tenants by `weight`; `quota` caps what they may hold at once.

    A workload whose tenant would go over quota (or over `max`, or borrow what others are
    guaranteed) waits in the queue; it does not fail.
    """

    name: str = Field(min_length=1)
    weight: float = Field(default=1.0, gt=0)
    quota: ResourceVector | None = None
    min: ResourceVector | None = None
    max: ResourceVector | None = None
    parent: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _min_within_max(self) -> Tenant:
        problems: list[tuple[Loc, str, object]] = []
        if self.parent == self.name:
            problems.append((("parent",), "a tenant cannot be its own parent", self.parent))
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
    def elastic(self) -> bool:
        """Whether the tenant has an elastic quota (a `min` or a `max`)."""
        return self.min is not None or self.max is not None
