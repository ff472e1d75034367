"""BucketFit: best-fit node choice through gradient buckets of remaining amounts (seed S4).

A select plugin: it replaces "highest total score first" with the order of seed S4, read from
the `BucketIndex` (state/buckets.py) so a cycle looks at the few buckets near the demand instead
of sorting every node:

* S4.1 every node is filed, per resource, into the bucket holding its remaining amount;
* S4.4 the workload's *dominant resource* (largest request / cluster capacity among the classes
  it asks for; ties to the lowest state row) decides which resource's buckets are searched;
* S4.2 its demand X selects bucket K (the one whose range holds X); in K the node whose
  remainder is closest to X comes first (smallest remainder >= X: best fit, least fragment);
* S4.3 then buckets K+1 ... K+maxUp upward, smallest remainder first in each; then from the
  largest bucket M downward to K+maxUp+1: the first non-empty bucket P is the largest range
  left, and inside P, as everywhere, the node whose remainder is closest to X comes first
  (patent 004 step 209 and the claims: the same "preset condition", the smallest difference
  between remainder and demand). With the default maxUp (every bucket above K) the downward
  phase is empty;
* S4.4 after the allocation every resource's buckets are updated: `ClusterState.assume` calls
  the index's `refresh`, which re-files the node in all of them.

Only nodes that passed every filter (`nodes.mask`) are yielded, lazily, each at most once, so
the scheduler pays only for the nodes it tries. Scores from other plugins are ignored.

Worked example: cpu buckets lower 0, width 2 cpu, count 4 -> [0,2) [2,4) [4,6) [6,∞); nodes
with free cpu n0 = 5, n1 = 4.5, n2 = 7, n3 = 1 (all other classes plentiful).
Demand 4 cpu -> K = 2 -> n1 (4.5, closest to 4), n0 (5); then K+1 = 3 -> n2 (7); n3 never fits.
Demand 1.5 cpu with maxUp 0 -> K = 0 holds only n3 (1 < 1.5): no fit; no upward buckets; down
from M = 3: n2 (7), then bucket 2 closest to 1.5 first: n1 (4.5), n0 (5); bucket 1 is empty.

Args (profile YAML)::

    - name: BucketFit
      args:
        resources:                          # optional; others get 16 buckets over [0, max]
          cpu: {lower: "0", width: "2", count: 8}     # quantities in the resource's unit
          memory: {edges: ["0", 4Gi, 16Gi, 64Gi]}     # or explicit ascending edges
        maxUp: 2                            # optional int >= 0; default: every bucket above K
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Any, ClassVar

import pydantic
from pydantic import Field

from finesched.errors import ErrorDetail, ValidationError
from finesched.model.base import Model
from finesched.model.resources import canonical_name, check_name, resource_kind
from finesched.quantity import QuantityError, parse_quantity
from finesched.sched.cycle_state import CycleState
from finesched.sched.framework import NodeBatch, ScoreArray
from finesched.sched.request import ScheduleRequest
from finesched.state.buckets import BucketIndex, BucketSpec
from finesched.state.cluster import ClusterState

ARGS_PATH = "args"


class _SpecArgs(Model):
    """One resource's buckets as written: ``{lower, width, count}`` or ``{edges}`` (quantities)."""

    lower: Any = 0
    width: Any = None
    count: int | None = Field(default=None, ge=1, strict=True)
    edges: list[Any] | None = Field(default=None, min_length=1)


class _Args(Model):
    resources: dict[str, _SpecArgs] = Field(default_factory=dict)
    max_up: int | None = Field(default=None, ge=0, strict=True)


def dominant_row(rows: Sequence[int], amounts: Sequence[int], capacity: Sequence[int]) -> int | None:
    """The requested row with the largest request / capacity share (S4.4), ties to the lowest row.

    Exact (fractions, no float ties). A row no node offers (capacity 0) dominates: no node fits
    it anyway. Example: capacity cpu 32000m, memory 64Gi; request 2000m (1/16) and 8Gi (1/8)
    -> memory. None when nothing is requested.
    """
    best: tuple[bool, Fraction] | None = None
    best_row = None
    for r, amount in sorted(zip(rows, amounts, strict=True)):
        cap = capacity[r]
        key = (cap <= 0, Fraction(amount, cap) if cap > 0 else Fraction(0))
        if best is None or key > best:
            best, best_row = key, r
    return best_row


def search_order(index: BucketIndex, resource: str, demand: int, max_up: int | None) -> Iterator[int]:
    """Every node with remaining `resource` >= `demand`, in S4.2-S4.3 order (no other filter).

    K = bucket of demand, M = the last bucket, top = min(M, K + max_up):
    K ascending from demand (S4.2); K+1..top ascending (S4.3 upward); then the buckets M..top+1
    from the largest down, each ascending: closest to the demand first (S4.3 downward, step
    209). Buckets above K only hold amounts >= their lower edge > demand, and every bucket is
    visited once, so each node appears at most once.
    """
    k = index.bucket_of(resource, demand)
    last = index.bucket_count(resource) - 1
    top = last if max_up is None else min(last, k + max_up)
    for b in (*range(k, top + 1), *range(last, top, -1)):
        yield from index.iter_bucket_ascending(resource, b, demand)


class BucketFit:
    """Select plugin: seed S4's bucketed best fit on the dominant resource (see the module docstring)."""

    NAME: ClassVar[str] = "BucketFit"

    def __init__(self, specs: Mapping[str, BucketSpec] | None = None, max_up: int | None = None):
        if max_up is not None and max_up < 0:
            raise ValueError(f"max_up must be >= 0, got {max_up}")
        self.specs: dict[str, BucketSpec] = dict(specs or {})
        self.max_up = max_up

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> BucketFit:
        """Build from profile args; raise ValidationError naming each bad field (``args.resources.cpu.width``)."""
        try:
            parsed = _Args.model_validate(dict(args))
        except pydantic.ValidationError as exc:
            raise ValidationError(
                [ErrorDetail(_path(*e["loc"]), e["msg"], e.get("input")) for e in exc.errors()]
            ) from None
        specs: dict[str, BucketSpec] = {}
        problems: list[ErrorDetail] = []
        for raw_name, spec_args in parsed.resources.items():
            where = ("resources", raw_name)
            problem = check_name(raw_name)
            name = canonical_name(raw_name)
            if problem is None and name in specs:
                problem = f"names the same resource as another key ({name})"
            if problem is not None:
                problems.append(ErrorDetail(_path(*where), problem, raw_name))
                continue
            spec = _to_spec(name, spec_args, where, problems)
            if spec is not None:
                specs[name] = spec
        if problems:
            raise ValidationError(problems)
        return cls(specs, parsed.max_up)

    def attach(self, state: ClusterState) -> None:
        """Attach this plugin's BucketIndex (or check the one already attached uses the same specs)."""
        index = state.attach(BucketIndex(state, self.specs))
        if index.specs != self.specs:
            raise ValidationError(
                "another BucketFit with different bucket specs is already attached to this state",
                path=f"plugins.{self.NAME}.{ARGS_PATH}.resources",
            )

    def index(self, state: ClusterState) -> BucketIndex:
        """The state's BucketIndex, attached now if missing (e.g. dropped by `ClusterState.restore`)."""
        index = state.extras.get(BucketIndex.name)
        if index is None:
            self.attach(state)
            index = state.extras[BucketIndex.name]
        assert isinstance(index, BucketIndex), type(index)
        return index

    def select(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch, total: ScoreArray) -> Iterator[int]:
        """Feasible nodes in S4 order, lazily; lowest index first when nothing is requested.

        The order is read live from the index, so consume it before changing the state (the
        scheduler stops at the first node whose reserve succeeds, before it assumes).
        """
        state = nodes.state
        mask = nodes.mask
        totals = state.totals()
        capacity = [totals.get(name, 0) for name in state.resources]
        r = dominant_row(request.share_rows.tolist(), request.share_amounts.tolist(), capacity)
        if r is None:
            yield from (int(i) for i in nodes.indices)
            return
        demand = int(request.share_amounts[request.share_rows.tolist().index(r)])
        for i in search_order(self.index(state), state.resources[r], demand, self.max_up):
            if mask is None or mask[i]:
                yield i


def _to_spec(name: str, args: _SpecArgs, where: tuple[str, ...], problems: list[ErrorDetail]) -> BucketSpec | None:
    """The BucketSpec `args` describe, with quantities read in `name`'s unit; problems appended."""
    kind = resource_kind(name)
    before = len(problems)

    def amount(value: Any, *loc: str | int) -> int:
        try:
            return parse_quantity(value, kind)
        except QuantityError as exc:
            problems.append(ErrorDetail(_path(*where, *loc), str(exc), value))
            return 0

    if args.edges is not None:
        extra = sorted({"lower", "width", "count"} & args.model_fields_set)
        if extra:
            problems.append(ErrorDetail(_path(*where), f"give either edges or lower/width/count, not both ({extra})"))
            return None
        edges = [amount(value, "edges", j) for j, value in enumerate(args.edges)]
        if len(problems) == before:
            for j in range(1, len(edges)):
                if edges[j] <= edges[j - 1]:
                    rule = "edges must be strictly ascending"
                    problems.append(ErrorDetail(_path(*where, "edges", j), rule, args.edges[j]))
        return BucketSpec.explicit(edges) if len(problems) == before else None
    lower = amount(args.lower, "lower")
    width = amount(args.width, "width") if args.width is not None else None
    if width is not None and width < 1 and len(problems) == before:
        problems.append(ErrorDetail(_path(*where, "width"), "must be greater than 0", args.width))
    for missing in ("width", "count"):
        if getattr(args, missing) is None:
            problems.append(ErrorDetail(_path(*where, missing), "required (or give edges instead)"))
    if len(problems) > before or width is None or args.count is None:
        return None
    return BucketSpec.equal(lower, width, args.count)


def _path(*loc: str | int) -> str:
    return ".".join([ARGS_PATH, *(str(p) for p in loc)])
