"""Kueue's Topology-Aware Scheduling as the extender reads it: pod annotations and Topology objects.

A Pod asks for a network domain with Kueue's pod-template annotations
(``kueue.x-k8s.io/podset-required-topology``, ``…/podset-preferred-topology``,
``…/podset-slice-required-topology`` with ``…/podset-slice-size``; ``…/podset-unconstrained-topology:
"true"`` asks for none). The annotations name a *level* (a node label), not a topology; the
extender picks the topology whose levels contain it (`resolve_topology`): the one named by the
pod's ``kueue.x-k8s.io/topology`` annotation when given, else the first by name among the known
topologies that have the level (and the slice level). The ResourceFlavor's ``topologyName``, which
Kueue uses, is not visible on the Pod.

The gang is Kueue's plain-pod group: label ``kueue.x-k8s.io/pod-group-name`` (the gang's name, per
namespace) and annotation ``kueue.x-k8s.io/pod-group-total-count`` (its member count); label
``kueue.x-k8s.io/pod-group-pod-index`` orders members for slices. A Pod with topology annotations
but no group label is placed alone (its annotations are still checked): the extender cannot know
its fellow members (Kueue's own TAS keeps such pods in its domain with a node selector).

Kueue's ``Topology`` objects (``kueue.x-k8s.io/v1beta2``, cluster-scoped, ``spec.levels[].nodeLabel``)
convert to finesched's `Topology` (`kueue_topology`). Bad input raises `PodError` (pods) or
`ValueError` (Topology objects) with the annotation or field, the value and the rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pydantic

from finesched.k8s.convert import PodError
from finesched.model.topology import GangTopology, Topology, TopologySlice, label_key_problem
from finesched.model.workload import Gang, Workload

REQUIRED = "kueue.x-k8s.io/podset-required-topology"
PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
UNCONSTRAINED = "kueue.x-k8s.io/podset-unconstrained-topology"
SLICE_REQUIRED = "kueue.x-k8s.io/podset-slice-required-topology"
SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"
#: finesched's reading: which topology the levels belong to, when several have them.
TOPOLOGY_NAME = "kueue.x-k8s.io/topology"
GROUP_NAME = "kueue.x-k8s.io/pod-group-name"  # label
GROUP_TOTAL = "kueue.x-k8s.io/pod-group-total-count"  # annotation
GROUP_INDEX = "kueue.x-k8s.io/pod-group-pod-index"  # label
#: Kueue's Topology kind: (group, version, plural).
KUEUE_TOPOLOGY_API = ("kueue.x-k8s.io", "v1beta2", "topologies")
_MAX_COUNT = 1_000_000


@dataclass(frozen=True)
class TopologyAsk:
    """What a Pod's annotations ask (before the topology is known)."""

    group: str | None  # the pod-group name (None: no group label, the pod is placed alone)
    count: int
    index: int | None
    required: str | None
    preferred: str | None
    slice_size: int | None
    slice_level: str | None
    topology: str | None  # the kueue.x-k8s.io/topology annotation

    @property
    def level(self) -> str:
        return self.required or self.preferred or ""

    @property
    def where(self) -> str:
        """The annotation that gave the level (for messages)."""
        return REQUIRED if self.required is not None else PREFERRED


def _level(annotations: Mapping[str, str], key: str) -> str | None:
    value = annotations.get(key)
    if value is None:
        return None
    problem = label_key_problem(value)
    if problem is not None:
        raise PodError(f"annotation {key}: {value!r} {problem}")
    return value


def _count(text: str | None, where: str, low: int) -> int | None:
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        value = None
    if value is None or not low <= value <= _MAX_COUNT:
        raise PodError(f"{where}: {text!r} must be an integer from {low} to {_MAX_COUNT}")
    return value


def topology_ask(labels: Mapping[str, str], annotations: Mapping[str, str]) -> TopologyAsk | None:
    """The Pod's topology request, None when it makes none; raise PodError naming the annotation,
    its value and the rule it breaks."""
    unconstrained = annotations.get(UNCONSTRAINED)
    if unconstrained is not None and unconstrained not in ("true", "false"):
        raise PodError(f'annotation {UNCONSTRAINED}: {unconstrained!r} must be "true" or "false"')
    required, preferred = _level(annotations, REQUIRED), _level(annotations, PREFERRED)
    slice_level = _level(annotations, SLICE_REQUIRED)
    slice_size = _count(annotations.get(SLICE_SIZE), f"annotation {SLICE_SIZE}", 1)
    asked = [k for k, v in ((REQUIRED, required), (PREFERRED, preferred)) if v is not None]
    if unconstrained == "true" and asked:
        raise PodError(f'annotation {UNCONSTRAINED}: "true" cannot be given with {asked[0]} (no constraint or one)')
    if len(asked) == 2:
        raise PodError(f"annotations {REQUIRED} and {PREFERRED}: give one of them, not both")
    if (slice_level is None) != (slice_size is None):
        given, missing = (SLICE_REQUIRED, SLICE_SIZE) if slice_size is None else (SLICE_SIZE, SLICE_REQUIRED)
        raise PodError(f"annotation {given}: needs annotation {missing} too (a slice is a level and a size)")
    if not asked:
        if slice_level is not None:
            raise PodError(f"annotation {SLICE_REQUIRED}: needs {REQUIRED} or {PREFERRED} (the level the slices share)")
        return None
    group = labels.get(GROUP_NAME) or None
    count = 1
    if group is not None:
        total = _count(annotations.get(GROUP_TOTAL), f"annotation {GROUP_TOTAL}", 1)
        if total is None:
            rule = f"needs annotation {GROUP_TOTAL} (how many pods the group has)"
            raise PodError(f"label {GROUP_NAME} {group!r}: {rule}")
        count = total
    index = _count(labels.get(GROUP_INDEX), f"label {GROUP_INDEX}", 0)
    if slice_size is not None and group is not None and count % slice_size:
        rule = f"must divide {GROUP_TOTAL} ({count}): the group is cut into whole slices"
        raise PodError(f"annotation {SLICE_SIZE}: {slice_size} {rule}")
    name = annotations.get(TOPOLOGY_NAME) or None
    return TopologyAsk(group, count, index, required, preferred, slice_size, slice_level, name)


def resolve_topology(ask: TopologyAsk, topologies: Mapping[str, Topology]) -> Topology:
    """The topology the ask's levels belong to (the module docstring's rule); PodError if none."""
    levels = [ask.level] + ([ask.slice_level] if ask.slice_level else [])
    known = ", ".join(sorted(topologies)) or "none"
    if ask.topology is not None:
        topology = topologies.get(ask.topology)
        if topology is None:
            rule = f"is not a topology the extender knows ({known})"
            raise PodError(f"annotation {TOPOLOGY_NAME}: {ask.topology!r} {rule}")
        candidates = [topology]
    else:
        candidates = [topologies[n] for n in sorted(topologies) if topologies[n].depth_of(ask.level) is not None]
        if not candidates:
            rule = f"is not a level of any topology the extender knows ({known})"
            raise PodError(f"annotation {ask.where}: {ask.level!r} {rule}")
        with_slice = [t for t in candidates if all(t.depth_of(level) is not None for level in levels)]
        candidates = with_slice or candidates
    topology = candidates[0]
    problems = _gang_topology(ask, topology).problems_in(topology)
    if problems:
        loc, rule, value = problems[0]
        key = SLICE_REQUIRED if loc and loc[0] == "slice" else ask.where
        rule = rule.replace(f"as required ({ask.level})", f"as {ask.where}").replace(
            f"as preferred ({ask.level})", f"as {ask.where}"
        )
        raise PodError(f"annotation {key}: {value!r} {rule}")
    return topology


def _gang_topology(ask: TopologyAsk, topology: Topology) -> GangTopology:
    sliced = None
    if ask.slice_size is not None and ask.slice_level is not None:
        sliced = TopologySlice(size=ask.slice_size, required=ask.slice_level)
    return GangTopology(name=topology.name, required=ask.required, preferred=ask.preferred, slice=sliced)


def with_topology_gang(workload: Workload, ask: TopologyAsk, topologies: Mapping[str, Topology]) -> Workload:
    """`workload` as a member of its pod group's gang, with the topology its annotations ask for."""
    topology = resolve_topology(ask, topologies)
    gang = Gang(name=ask.group or workload.name, min_member=ask.count, topology=_gang_topology(ask, topology))
    return workload.model_copy(update={"gang": gang})


def kueue_topology(obj: Mapping[str, Any]) -> Topology:
    """A Kueue ``Topology`` object as finesched's Topology; ValueError naming the field if unreadable."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = (meta or {}).get("name") if isinstance(meta, Mapping) else None
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    levels = spec.get("levels") if isinstance(spec, Mapping) else None
    if not isinstance(levels, list) or not all(isinstance(level, Mapping) for level in levels):
        raise ValueError(f"Topology {name or '?'}: spec.levels: expected a list of {{nodeLabel: ...}}")
    try:
        return Topology.model_validate(
            {"name": name, "levels": [{"nodeLabel": level.get("nodeLabel")} for level in levels]}
        )
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"Topology {name or '?'}: {where}: {first['msg']}") from None
