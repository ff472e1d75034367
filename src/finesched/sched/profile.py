"""Profiles: which plugins a scheduler runs, with what score weights and arguments.

A profile is data (YAML or a dict), validated when the scheduler starts: unknown plugin names,
negative or non-integer weights and bad arguments are errors listing what is allowed. Built-in
profiles cover the common choices; users write their own in YAML:

```yaml
name: packing
plugins:
  - {name: NodeSelector}
  - {name: ResourcesFit}
  - {name: MostAllocated, weight: 2}
tieBreak: random      # lowest-index (default) | random
seed: 7
topologyPolicy: BestFit   # BestFit (default) | KeepDomainsWhole: a topology gang's domain
defragmentation: {}       # move workloads that allow it to make room (Defragmentation; off if absent)
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml
from pydantic import Field, NonNegativeInt

from finesched.errors import ErrorDetail, ValidationError
from finesched.model.base import Model


class PluginConfig(Model):
    name: str = Field(min_length=1)
    weight: NonNegativeInt = 1
    args: dict[str, Any] = Field(default_factory=dict)


class Defragmentation(Model):
    """The defragmenter's settings (sched/defrag.py); a profile without them never moves anything.

    ```yaml
    defragmentation:
      maxMovesPerPlan: 4             # moves one waiting workload may cost
      maxMovesPerMinute: 20          # over the whole cluster (a sliding minute)
      maxMovesPerTenantPerMinute: 10 # per tenant of the moved workloads
      cooldownSeconds: 600           # a workload moved is not moved again before this
      candidateNodes: 16             # nodes tried as the waiting workload's target
    ```
    """

    max_moves_per_plan: int = Field(default=4, ge=1, le=16)
    max_moves_per_minute: int = Field(default=20, ge=1, le=100_000)
    max_moves_per_tenant_per_minute: int = Field(default=10, ge=1, le=100_000)
    cooldown_seconds: float = Field(default=600.0, ge=0, le=86_400 * 7)
    candidate_nodes: int = Field(default=16, ge=1, le=1_000)


class Profile(Model):
    """Enabled plugins in order, with score weights; ties broken by lowest node index or a seeded order."""

    name: str = "custom"
    plugins: tuple[PluginConfig, ...] = Field(min_length=1)
    tie_break: Literal["lowest-index", "random"] = "lowest-index"
    seed: int = 0
    #: How many nodes the exact reserve step may try before the workload is reported unschedulable.
    max_reserve_attempts: int = Field(default=100, ge=1)
    #: How a topology gang's domain is chosen among those that hold it (sched/topology.py):
    #: BestFit (Kueue's: the tightest fit) or KeepDomainsWhole (the one whose use least reduces
    #: how many of the typical gang sizes the domains can still hold).
    topology_policy: Literal["BestFit", "KeepDomainsWhole"] = "BestFit"
    #: Move running workloads that opted in (`spec.migration`) to make room for waiting ones
    #: (sched/defrag.py); None (the default): never.
    defragmentation: Defragmentation | None = None
    #: Where the profile came from (its file), so errors found when the scheduler starts name it.
    source: str = Field(default="", exclude=True)

    @classmethod
    def parse(cls, data: object, *, where: str = "profile") -> Profile:
        try:
            return cls.model_validate(data)
        except pydantic.ValidationError as exc:
            raise ValidationError(
                [ErrorDetail(".".join(str(p) for p in e["loc"]), e["msg"], e.get("input"), where) for e in exc.errors()]
            ) from None

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise ValidationError([ErrorDetail("", f"cannot read profile: {exc}", where=str(path))]) from None
        if isinstance(data, dict) and "source" not in data:
            data = {**data, "source": str(path)}
        return cls.parse(data, where=str(path))

    def plugin_names(self) -> list[str]:
        return [p.name for p in self.plugins]


def _profile(name: str, *plugins: tuple[str, int] | str | dict[str, Any], **extra: Any) -> Profile:
    configs = [
        p if isinstance(p, dict) else {"name": p} if isinstance(p, str) else {"name": p[0], "weight": p[1]}
        for p in plugins
    ]
    return Profile.model_validate({"name": name, "plugins": configs, **extra})


#: Reserve runs in profile order: NUMAAlign writes the NUMA affinity that CPUOrchestration and
#: DeviceShare then allocate under.
_FILTERS = ("NodeUnschedulable", "TenantIsolation", "NodeSelector", "ResourcesFit", "NUMAAlign", "CPUOrchestration",
            "DeviceShare")  # fmt: skip

#: Built-in profiles. "default" spreads like kube-scheduler's default (least requested + balanced,
#: device classes included, and preemption on: DefaultPreemption); "binpack" packs nodes and their
#: devices: DeviceScore MostAllocated picks the node, and DeviceShare's card-level default is
#: MostAllocated (the most-used card that still fits, S0.5) instead of LeastAllocated.
BUILTIN_PROFILES: dict[str, Profile] = {
    "default": _profile("default", *_FILTERS, ("LeastRequested", 1), ("MostBalanced", 1), "DefaultPreemption"),
    "binpack": _profile(
        "binpack",
        *(f if f != "DeviceShare" else {"name": f, "args": {"strategy": "MostAllocated"}} for f in _FILTERS),
        ("MostAllocated", 1),
        ("DeviceScore", 1),
    ),
    "spread": _profile("spread", *_FILTERS, ("LeastRequested", 1)),
    "buckets": _profile("buckets", *_FILTERS, "BucketFit"),
}


def resolve_profile(profile: str | Profile | dict[str, Any]) -> Profile:
    """A Profile from a built-in name, a YAML path, a dict, or a Profile."""
    if isinstance(profile, Profile):
        return profile
    if isinstance(profile, dict):
        return Profile.parse(profile)
    if profile in BUILTIN_PROFILES:
        return BUILTIN_PROFILES[profile]
    if Path(profile).suffix in (".yaml", ".yml", ".json") or Path(profile).exists():
        return Profile.load(profile)
    raise ValidationError(
        f"unknown profile; built-in profiles: {sorted(BUILTIN_PROFILES)} (or give a YAML file)",
        path="profile",
        value=profile,
    )
