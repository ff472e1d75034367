"""Topology: the network tree of a cluster as node labels, and what a gang asks of it.

Data centres are trees: nodes in racks (one leaf switch), racks in blocks (one spine), sometimes
several nodes in one NVLink domain. A `Topology` (kind Topology, cluster-scoped, the shape of
Kueue's `kueue.x-k8s.io/v1beta2` Topology and KAI-Scheduler's) names that tree's levels, coarse to
fine, each by the node label that holds it (`topology.finesched.io/block`,
`topology.finesched.io/rack`, `kubernetes.io/hostname`). A domain of a level is the tuple of the
node's label values from the top level down to it, so rack `r1` of block `b1` is not rack `r1` of
block `b2`. A node that lacks the label of a level (or of a level above it) is outside every
domain of that level, and of the levels below; it is still a node of the cluster.

A gang (`Workload.gang`, a dataflow Job) asks with `topology: {name, required: LEVEL}` (all members
inside one domain of LEVEL, else it waits) or `{name, preferred: LEVEL}` (the smallest domain that
holds it: LEVEL, else the next level up, else anywhere), and optionally
`slice: {size: N, required: LEVEL}`: every N consecutive members (by index) inside one domain of
LEVEL, a level the same as or finer than the gang's (Kueue's podset-slice-required-topology).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, PositiveInt, model_validator

from finesched.model.base import Loc, Model, raise_problems
from finesched.model.names import ObjectName

#: At most this many levels (Kueue's limit).
MAX_LEVELS = 16
#: The level that names one node; allowed only as the finest (last) level, as in Kueue.
HOSTNAME_LABEL = "kubernetes.io/hostname"
#: Labels finesched's examples and the simulator use for its own clusters.
BLOCK_LABEL = "topology.finesched.io/block"
RACK_LABEL = "topology.finesched.io/rack"

# A Kubernetes label key: an optional DNS-subdomain prefix (<= 253) and a name (<= 63).
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
LABEL_KEY_RULE = (
    "must be a label key: an optional DNS subdomain prefix of at most 253 characters and '/', then a name of "
    "at most 63 characters of alphanumerics, '-', '_' or '.' that starts and ends with an alphanumeric "
    "(e.g. 'topology.finesched.io/rack')"
)


def label_key_problem(key: str) -> str | None:
    """Why `key` is not a Kubernetes label key (None: it is one)."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _PREFIX.match(prefix)):
        return LABEL_KEY_RULE
    if not name or len(name) > 63 or not _NAME.match(name):
        return LABEL_KEY_RULE
    return None


def _label_key(value: str) -> str:
    problem = label_key_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


#: `label_key_problem`'s rule as a JSON schema pattern (the API's document gives it to clients). The
#: prefix's limit of 253 characters is the server's to check (422 naming the field); maxLength
#: bounds the whole key.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
#: A node label key naming a level (a prefix of at most 253 characters, '/', a name of at most 63).
LabelKey = Annotated[
    str,
    Field(min_length=1, max_length=317, json_schema_extra={"pattern": LABEL_KEY_PATTERN}),
    AfterValidator(_label_key),
]


class TopologyLevel(Model):
    """One level of the tree: the node label whose value names a node's domain at this level."""

    node_label: LabelKey


class Topology(Model):
    """A named tree of levels, coarse to fine (see the module docstring)."""

    name: ObjectName
    #: 1..MAX_LEVELS, checked with the rest in `_levels` (a length constraint here would add a
    #: second, misleading error whenever one level is invalid).
    levels: tuple[TopologyLevel, ...] = Field(json_schema_extra={"minItems": 1, "maxItems": MAX_LEVELS})

    @model_validator(mode="after")
    def _levels(self) -> Topology:
        problems: list[tuple[Loc, str, object]] = []
        if not 1 <= len(self.levels) <= MAX_LEVELS:
            levels = [level.node_label for level in self.levels]
            problems.append((("levels",), f"a topology has 1 to {MAX_LEVELS} levels, coarse to fine", levels))
        seen: set[str] = set()
        for i, level in enumerate(self.levels):
            if level.node_label in seen:
                rule = "is given twice: each level has its own label"
                problems.append((("levels", i, "nodeLabel"), rule, level.node_label))
            seen.add(level.node_label)
            if level.node_label == HOSTNAME_LABEL and i != len(self.levels) - 1:
                rule = f"{HOSTNAME_LABEL} may only be the last (finest) level"
                problems.append((("levels", i, "nodeLabel"), rule, level.node_label))
        raise_problems(problems, "Topology")
        return self

    @property
    def labels(self) -> tuple[str, ...]:
        """The levels' node labels, coarse to fine."""
        return tuple(level.node_label for level in self.levels)

    def depth_of(self, label: str) -> int | None:
        """The index of the level `label` names (0 = coarsest), None when it is not a level."""
        try:
            return self.labels.index(label)
        except ValueError:
            return None


class TopologySlice(Model):
    """Every `size` consecutive members (by index) inside one domain of level `required`."""

    size: PositiveInt = Field(le=1_000_000)
    required: LabelKey


class GangTopology(Model):
    """Where a gang's members go in topology `name`: one domain of level `required` (or wait), or
    the smallest domain that holds them from level `preferred` up (then anywhere); `slice` keeps
    every `slice.size` consecutive members inside one domain of a level as fine or finer.

    Which labels are levels of the topology is checked where topologies are known (admission and
    the scheduler); the model checks the shape: exactly one of required and preferred."""

    name: ObjectName
    required: LabelKey | None = None
    preferred: LabelKey | None = None
    slice: TopologySlice | None = None

    @model_validator(mode="after")
    def _one_level(self) -> GangTopology:
        if (self.required is None) == (self.preferred is None):
            given = {"required": self.required, "preferred": self.preferred}
            rule = "give exactly one of required and preferred (a level's node label)"
            raise_problems([((), rule, given)], "topology")
        return self

    @property
    def level(self) -> str:
        """The level the gang asks for (required or preferred)."""
        return self.required or self.preferred or ""

    def problems_in(self, topology: Topology | None) -> list[tuple[Loc, str, object]]:
        """Why this request does not fit `topology` (None: no such topology): unknown levels, a slice
        level coarser than the gang's level. Empty when it fits."""
        if topology is None:
            return [(("name",), "no such topology", self.name)]
        problems: list[tuple[Loc, str, object]] = []
        field = "required" if self.required is not None else "preferred"
        depth = topology.depth_of(self.level)
        allowed = ", ".join(topology.labels)
        if depth is None:
            problems.append(((field,), f"is not a level of topology {topology.name} (levels: {allowed})", self.level))
        if self.slice is not None:
            slice_depth = topology.depth_of(self.slice.required)
            if slice_depth is None:
                rule = f"is not a level of topology {topology.name} (levels: {allowed})"
                problems.append((("slice", "required"), rule, self.slice.required))
            elif depth is not None and slice_depth < depth:
                rule = f"must be the same level as {field} ({self.level}) or a finer one (levels: {allowed})"
                problems.append((("slice", "required"), rule, self.slice.required))
        return problems
