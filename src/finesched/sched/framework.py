"""The extension points of a scheduling cycle: codes, statuses, and one Protocol per point.

Modelled on the Kubernetes scheduling framework (interface.go), with one change that makes
finesched fast: `filter` and `score` see the *whole node batch* at once and answer with numpy
arrays, so a cycle is a few vectorized passes plus exact work on the chosen node only.

A plugin implements only the points it needs; the runtime finds them with `isinstance` against
these runtime-checkable Protocols when the profile is loaded.

Order of a cycle (sched/scheduler.py): pre_filter -> filter -> pre_score -> score ->
normalize_score -> (select) -> reserve -> pre_bind -> ClusterState.assume.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from finesched.model.binding import Binding

if TYPE_CHECKING:
    from finesched.model.workload import Workload
    from finesched.sched.cycle_state import CycleState
    from finesched.sched.elastic import ReclaimRule
    from finesched.sched.request import ScheduleRequest
    from finesched.state.cluster import ClusterState

MAX_SCORE = 100
MIN_SCORE = 0

BoolArray = npt.NDArray[np.bool_]
ScoreArray = npt.NDArray[np.int64]
CountArray = npt.NDArray[np.int64]
IndexArray = npt.NDArray[np.intp]


class Code(IntEnum):
    """Outcome of a plugin call (the Kubernetes codes)."""

    SUCCESS = 0
    ERROR = 1  # a bug or bad input: the workload fails, it is not retried blindly
    UNSCHEDULABLE = 2  # may fit later, when the cluster changes
    UNRESOLVABLE = 3  # cannot fit on this node whatever happens to other workloads
    SKIP = 4  # the plugin has nothing to do for this workload


_OK_CODES = (Code.SUCCESS, Code.SKIP)


@dataclass(frozen=True, slots=True)
class Status:
    code: Code = Code.SUCCESS
    reasons: tuple[str, ...] = ()
    plugin: str = ""

    @property
    def ok(self) -> bool:
        return self.code in _OK_CODES

    @classmethod
    def unschedulable(cls, *reasons: str, plugin: str = "") -> Status:
        return cls(Code.UNSCHEDULABLE, reasons, plugin)

    @classmethod
    def error(cls, *reasons: str, plugin: str = "") -> Status:
        return cls(Code.ERROR, reasons, plugin)

    def message(self) -> str:
        return ", ".join(self.reasons) or self.code.name.lower()


SUCCESS = Status()
SKIP = Status(Code.SKIP)

#: A filter's explanation of its rejections: reason text -> (mask of nodes it applies to, code).
#: The code is one Code for every node of the mask, or a per-node bool array: True where the
#: reason is UNRESOLVABLE on that node (it could not fit the workload even with every workload on
#: it gone), False where it is UNSCHEDULABLE. Either way a node's code depends on that node alone.
Explanation = Mapping[str, tuple[BoolArray, "Code | BoolArray"]]


def unresolvable_where(code: Code | BoolArray, n: int) -> BoolArray:
    """[n] True where an explanation's `code` (one Code, or per node) is UNRESOLVABLE."""
    if isinstance(code, np.ndarray):
        return code.astype(bool, copy=False)
    return np.full(n, code == Code.UNRESOLVABLE, dtype=bool)


@dataclass(frozen=True, slots=True)
class FilterResult:
    """Which nodes pass a filter, and (lazily) why the others do not.

    `explain` is only called when a FitError is built, so the fast path pays nothing for the
    reasons. Each node rejected by this filter should be covered by at least one reason mask.
    """

    mask: BoolArray
    explain: Callable[[], Explanation] | None = None


class NodeBatch:
    """The nodes a filter or score call looks at, and (for scoring) which of them are feasible.

    A batch is either every node of `state` (`index` is None) or the subset `index` (node
    indices, ascending) — the scheduler re-evaluates only the nodes that changed since a request
    of the same shape was last evaluated (sched/memo.py). Plugins read per-node data through
    `row`, `rows` and `take`, which work for both kinds of batch, and return arrays of length
    `n` (the batch size). `mask` (scoring only) marks the feasible nodes of the batch.
    """

    __slots__ = ("__dict__", "index", "mask", "n", "state")

    def __init__(self, state: ClusterState, mask: BoolArray | None = None, index: IndexArray | None = None):
        self.state = state
        self.mask = mask
        self.index = index
        self.n = state.n if index is None else len(index)

    def with_mask(self, mask: BoolArray) -> NodeBatch:
        return NodeBatch(self.state, mask, self.index)

    # Gathers: a subset batch is usually a few dozen nodes, where numpy's per-call overhead is
    # the whole cost. Mixed or multi-dimensional fancy indexing (``a[r, index]``, ``a2d[index]``)
    # takes numpy's general path, 3-5x slower than the 1-D fast path (``a[r][index]``) or
    # ``take(index, axis=0)``, with identical results. (`take` first copies a non-contiguous
    # array whole, so it is used on contiguous ones only.)
    def row(self, array: npt.NDArray[Any], r: int) -> npt.NDArray[Any]:
        """Row `r` of a resource-major [R, n] state array, over this batch's nodes."""
        return array[r] if self.index is None else array[r][self.index]

    def take(self, array: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """The batch's entries of a node-major array ([n, ...] indexed by node first)."""
        if self.index is None:
            return array[: self.state.n]
        if array.ndim == 1 or not array.flags.c_contiguous:
            return array[self.index]
        return array.take(self.index, axis=0)

    def node(self, k: int) -> int:
        """The state index of the batch's k-th node."""
        return k if self.index is None else int(self.index[k])

    @cached_property
    def indices(self) -> IndexArray:
        """State indices of the feasible nodes (all batch nodes when there is no mask)."""
        base = np.arange(self.n) if self.index is None else self.index
        return base if self.mask is None else base[self.mask]


@runtime_checkable
class Plugin(Protocol):
    """Every plugin has a NAME (registry key, state-key prefix, Status.plugin).

    A plugin may also set ``NODE_LOCAL = True`` to promise that its filter and score results
    for a node depend only on the workload and that node's state, and that it evaluates subset
    batches (`NodeBatch.index`) correctly. When every filter and score plugin of a profile
    promises this (and none normalizes scores across nodes), the scheduler memoizes results
    per request shape and re-evaluates only the nodes that changed (sched/memo.py).
    """

    NAME: ClassVar[str]


@runtime_checkable
class PreFilterPlugin(Plugin, Protocol):
    def pre_filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> Status:
        """Check and precompute per-workload data once; store it in `cycle` under the plugin's keys.

        Per-node work belongs in filter/score, which may see a subset batch; pre_filter must
        not compute arrays over nodes that filter then indexes.

        ERROR ends the cycle as the user's error; UNSCHEDULABLE/UNRESOLVABLE end it with that
        reason for every node; SKIP means this plugin's filter has nothing to check.
        """
        ...


@runtime_checkable
class FilterPlugin(Plugin, Protocol):
    def filter(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> FilterResult:
        """mask[i] is True iff node i can fit the workload as far as this plugin can tell.

        May over-approve (the exact reserve step catches it) but must never reject a node the
        exact step could use. Must not mutate any state.
        """
        ...


#: What a count puts where it has no limit of its own (int32 max: far above any real member count,
#: and safe to sum over 10,000s of nodes in int64).
NO_LIMIT = 2**31 - 1


@runtime_checkable
class Count(Plugin, Protocol):
    def count(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> CountArray:
        """[n] int64 >= 0: how many copies of `request` fit on each node of the batch as the state
        is now, the copies placed one after another by this plugin's own rules (what a gang's
        members of one shape can take of a node; sched/topology.py sums it over domains).

        Implemented by filter plugins next to `filter`, after the same pre_filter (it reads what
        pre_filter wrote in `cycle`). Exact where the plugin's reserve is exact; where it is not
        (the plugin says so) an upper bound, never below what placing copies one by one achieves.
        NO_LIMIT means "no limit of mine". Must not mutate any state.
        """
        ...


@runtime_checkable
class PreScorePlugin(Plugin, Protocol):
    def pre_score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> Status:
        """Compute what score plugins share (e.g. resource shares after placement) once per cycle."""
        ...


@runtime_checkable
class ScorePlugin(Plugin, Protocol):
    def score(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch) -> ScoreArray:
        """[n] int64 scores in [MIN_SCORE, MAX_SCORE] for every node (values on infeasible nodes are
        ignored but must be in range too). The runtime checks the range, applies the profile
        weight and sums; higher wins.
        """
        ...


@runtime_checkable
class NormalizeScorePlugin(Plugin, Protocol):
    def normalize_score(
        self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch, scores: ScoreArray
    ) -> ScoreArray:
        """Rescale this plugin's raw scores over the feasible nodes into [MIN_SCORE, MAX_SCORE]."""
        ...


@runtime_checkable
class SelectPlugin(Plugin, Protocol):
    def select(self, cycle: CycleState, request: ScheduleRequest, nodes: NodeBatch, total: ScoreArray) -> Iterable[int]:
        """Feasible node indices in the order to try them (replaces "highest total score first").

        At most one select plugin runs per profile. The scheduler tries each yielded node with
        the reserve plugins and takes the first that succeeds.
        """
        ...


@runtime_checkable
class ReservePlugin(Plugin, Protocol):
    def reserve(self, cycle: CycleState, request: ScheduleRequest, node: int) -> Status:
        """Decide the exact allocation on node `node` (devices, cpuset, NUMA) and keep it in `cycle`.

        Return UNSCHEDULABLE when the exact allocation is impossible: the scheduler unreserves
        and tries the next node. Reserve does not change ClusterState; `ClusterState.assume`
        applies the binding that pre_bind completes.
        """
        ...

    def unreserve(self, cycle: CycleState, request: ScheduleRequest, node: int) -> None:
        """Drop what reserve decided for `node`. Idempotent; may be called even if reserve was not."""
        ...


@runtime_checkable
class PreBindPlugin(Plugin, Protocol):
    def pre_bind(self, cycle: CycleState, request: ScheduleRequest, node: int, binding: Binding) -> Binding:
        """Return `binding` completed with this plugin's reserved allocation (devices, cpuset, annotations)."""
        ...


@dataclass(frozen=True)
class Preemption:
    """A preemption decision: evict `victims` from `node` so that `preemptor` fits there.

    `binding` is the preemptor's exact binding on the state minus the victims (devices, cpuset,
    NUMA), checked with the profile's real filters and reserve; `reason` says why each victim
    may go ("priority 5 < 10", or "reclaim: tenant b borrows above its min"). `violations` is
    how many victims break a disruption budget by their eviction (kube-scheduler's NumPDBViolations).
    """

    preemptor: str
    node: str
    victims: tuple[Binding, ...]
    binding: Binding
    reasons: Mapping[str, str] = field(default_factory=dict)
    violations: int = 0

    @property
    def victim_keys(self) -> list[str]:
        return [v.workload for v in self.victims]


@runtime_checkable
class PreemptionHandle(Protocol):
    """What a post_filter plugin may ask of the scheduler (kube-scheduler's framework handle).

    `allowed`: [n] the only nodes the preemptor may go to and evict on (a topology gang's domain),
    None: any node."""

    allowed: BoolArray | None

    def reclaim_rule(self, workload: Workload) -> ReclaimRule | None:
        """The quota-reclaim rule for `workload` (sched/elastic.py), None when its tenant may not reclaim."""
        ...

    def try_without(
        self, cycle: CycleState, request: ScheduleRequest, node: int, victims: Iterable[str]
    ) -> Binding | None:
        """The preemptor's exact binding on `node` if the workloads `victims` were gone, else None.

        Runs the profile's filters, reserve and pre_bind on the state minus the victims, then
        restores the state exactly (nothing changes)."""
        ...

    def unresolvable(self, cycle: CycleState, request: ScheduleRequest, nodes: IndexArray) -> BoolArray:
        """[len(nodes)] True where the workload could not fit on that node even with every workload
        on it gone (a filter rejects it for a reason unresolvable there): no eviction helps there,
        whatever the other nodes are (kube-scheduler's UnschedulableAndUnresolvable)."""
        ...


@runtime_checkable
class PostFilterPlugin(Plugin, Protocol):
    def post_filter(
        self, cycle: CycleState, request: ScheduleRequest, handle: PreemptionHandle
    ) -> tuple[Preemption | None, str]:
        """Called when the workload fits on no node: a preemption that would make it fit, or None
        with the reason none exists. Must not change the state (the scheduler applies the result)."""
        ...


@runtime_checkable
class ShapeKeyPlugin(Plugin, Protocol):
    def shape_key(self, workload: Workload) -> Hashable:
        """What this node-local plugin's verdicts read of the workload beyond its request shape
        (which leaves identity and tenancy out), e.g. its tenant; None when nothing now. Memoized
        results are kept per request shape and these keys (sched/memo.py)."""
        ...


@runtime_checkable
class StateUser(Plugin, Protocol):
    """A plugin that keeps per-node accounts in the ClusterState (attached by the scheduler)."""

    def attach(self, state: ClusterState) -> None: ...


@runtime_checkable
class ResourceOwner(Plugin, Protocol):
    """A plugin that owns some request names (e.g. device resources), so the scalar fit skips them."""

    def owns(self, resource: str) -> bool: ...


@dataclass
class ExtensionPoints:
    """The plugins of a profile, grouped by the points they implement (built by the runtime)."""

    pre_filter: list[PreFilterPlugin] = field(default_factory=list)
    filter: list[FilterPlugin] = field(default_factory=list)
    #: The filter plugins that also count copies (`Count`).
    count: list[Count] = field(default_factory=list)
    pre_score: list[PreScorePlugin] = field(default_factory=list)
    score: list[tuple[ScorePlugin, int]] = field(default_factory=list)
    select: SelectPlugin | None = None
    reserve: list[ReservePlugin] = field(default_factory=list)
    pre_bind: list[PreBindPlugin] = field(default_factory=list)
    post_filter: PostFilterPlugin | None = None
