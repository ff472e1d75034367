"""A tenant: who shares the cluster, with what weight, within what quota (seed S4.5, DRF)."""

from __future__ import annotations

from pydantic import Field

from finesched.model.base import Model
from finesched.model.resources import ResourceVector


class Tenant(Model):
    """Dominant Resource Fairness weighs tenants by `weight`; `quota` caps what they may hold at once.

    A workload whose tenant would go over quota waits in the queue; it does not fail.
    """

    name: str = Field(min_length=1)
    weight: float = Field(default=1.0, gt=0)
    quota: ResourceVector | None = None
