"""Topology gangs in the extender: which nodes a member of a Kueue pod group may take.

kube-scheduler asks about one Pod at a time; a gang's domain must still be chosen for the whole
gang, with the real per-node fit (GPU shares on each card, cpusets, NUMA), and then kept:

* **The first member** (no member of its group holds a binding yet): the Scheduler places the whole
  gang in a trial (`Scheduler.schedule_gang` on `count` copies of the member, restricted to the
  nodes kube-scheduler offered, honouring ``gang.topology``), the trial is taken back at once, and
  the member may go to the nodes of the domain the trial chose at the gang's level (and, with
  slices, of its slice's domain). The plan is kept while the state does not change, so the
  prioritize call that follows the filter call sees the same domain.
* **Later members** may go only where the members already bound (or assumed by a bind not yet
  visible in the API) are: the same domain of the required level; for a preferred level the
  finest domain, from that level up, that still has a feasible node (else anywhere); with a slice,
  also the slice-level domain of the members of the same slice (member index from the label
  ``kueue.x-k8s.io/pod-group-pod-index``).
* A Pod with topology annotations but no group is one member alone: a required level only keeps
  it to nodes that carry that level's label.

Gang membership (pod key -> group and index) is noted when a Pod is converted (filter, bind) and
when the API shows it bound (the sync), and dropped with its binding.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from finesched.errors import ValidationError
from finesched.k8s.kueue import TopologyAsk
from finesched.k8s.nodes import NODE_NAME_LABEL
from finesched.model.workload import NodeAffinityTerm, Workload
from finesched.sched.diagnosis import FitError
from finesched.sched.scheduler import Scheduler
from finesched.state.topology import DomainIndex

Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Member:
    gang: str  # namespace/group
    index: int | None


@dataclass(frozen=True)
class Allowed:
    """Where a member may go: `mask` over the state's nodes (None: anywhere) and why others are not."""

    mask: Mask | None
    reason: str


class TopologyGangs:
    """Membership and domain choice of topology gangs (see the module docstring)."""

    def __init__(self, scheduler: Scheduler, keep: int = 64):
        self.scheduler = scheduler
        self.state = scheduler.state
        #: Pod key -> its group membership.
        self.members: dict[str, Member] = {}
        #: (gang, offered nodes) -> (state version after the trial, trial nodes by member number).
        self._plans: OrderedDict[tuple[str, bytes], tuple[object, list[int] | FitError]] = OrderedDict()
        self._keep = keep

    @staticmethod
    def gang_key(workload: Workload, ask: TopologyAsk) -> str | None:
        return f"{workload.namespace}/{ask.group}" if ask.group is not None else None

    def note(self, pod_key: str, gang: str, index: int | None) -> None:
        self.members[pod_key] = Member(gang, index)

    def forget(self, pod_key: str) -> None:
        self.members.pop(pod_key, None)

    # Where a member may go --------------------------------------------------------------------------------
    def prepare(self, workload: Workload, ask: TopologyAsk, offered: Mask) -> None:
        """Run the first member's trial now (it changes the state's change position), so the
        assessment made after it stays valid for `allowed` and for the prioritize call."""
        gang, key = workload.gang, self.gang_key(workload, ask)
        if gang is None or gang.topology is None or key is None or gang.topology.name not in self.scheduler.topologies:
            return
        if not self._bound(key, workload.key):
            self._plan(key, workload, ask, offered)

    def allowed(self, workload: Workload, ask: TopologyAsk, offered: Mask, feasible: Mask) -> Allowed:
        """The nodes member `workload` may take (`offered`: the nodes kube-scheduler asked about;
        `feasible`: those where the member fits on its own)."""
        gang = workload.gang
        if gang is None or gang.topology is None:
            return Allowed(None, "")
        topology = self.scheduler.topologies.get(gang.topology.name)
        if topology is None:  # removed between the conversion and now
            return Allowed(np.zeros(self.state.n, dtype=bool), f"topology {gang.topology.name} is not known")
        index = self.scheduler.topology.domains(topology)
        depth = topology.depth_of(gang.topology.level)
        assert depth is not None  # resolve_topology checked it
        level = gang.topology.level
        key = self.gang_key(workload, ask)
        if key is None:
            if ask.required is None:
                return Allowed(None, "")
            return Allowed(index.ids[depth] >= 0, f"node has no label {level} (a level the pod requires)")
        bound = self._bound(key, workload.key)
        if bound:
            nodes = [node for _, node in bound]
        else:
            plan = self._plan(key, workload, ask, offered)
            if isinstance(plan, FitError):
                return Allowed(np.zeros(self.state.n, dtype=bool), plan.message)
            nodes = plan
            bound = list(enumerate(plan))
        mask, reason = self._domain(index, depth, level, ask, nodes, feasible, ask.group or "")
        slice_ = gang.topology.slice
        if slice_ is not None and ask.index is not None:
            mine = [node for i, node in bound if i is not None and i // slice_.size == ask.index // slice_.size]
            slice_depth = topology.depth_of(slice_.required)
            if mine and slice_depth is not None:
                domain = int(index.ids[slice_depth][mine[0]])
                inside = index.ids[slice_depth] == domain
                mask = inside if mask is None else mask & inside
                where = index.name(slice_depth, domain) if domain >= 0 else "?"
                reason = f"outside {slice_.required} {where}, the domain of the pod's slice of gang {ask.group}"
        return Allowed(mask, reason)

    def _bound(self, gang: str, own: str) -> list[tuple[int | None, int]]:
        """(member index, node position) of the gang's members holding a binding, by index then name."""
        state = self.state
        found = []
        for key, member in self.members.items():
            binding = state.bindings.get(key)
            if member.gang == gang and key != own and binding is not None and binding.node in state.index:
                found.append((member.index, key, state.index[binding.node]))
        found.sort(key=lambda t: (t[0] is None, t[0] or 0, t[1]))
        return [(i, node) for i, _, node in found]

    def _domain(
        self,
        index: DomainIndex,
        depth: int,
        level: str,
        ask: TopologyAsk,
        nodes: list[int],
        feasible: Mask,
        group: str,
    ) -> tuple[Mask | None, str]:
        """The domain of `nodes` (the first's) at the gang's level; for a preferred level the finest
        one from there up that still has a feasible node, else no restriction."""
        first = nodes[0]
        for d in range(depth, -1, -1):
            domain = int(index.ids[d][first])
            inside = index.ids[d] == domain if domain >= 0 else np.zeros(self.state.n, dtype=bool)
            name = index.name(d, domain) if domain >= 0 else "(none)"
            reason = f"outside {index.topology.labels[d]} {name}, the domain of gang {group}"
            if ask.required is not None:
                return inside, reason
            if (inside & feasible[: len(inside)]).any():
                return inside, reason
        return None, ""

    def _plan(self, gang: str, workload: Workload, ask: TopologyAsk, offered: Mask) -> list[int] | FitError:
        """Node positions of the whole gang placed in a trial (taken back at once), or why it does not fit."""
        state = self.state
        key = (gang, np.packbits(offered).tobytes())
        kept = self._plans.get(key)
        if kept is not None and kept[0] == state.version:
            return kept[1]
        names = tuple(state.names[i] for i in np.flatnonzero(offered).tolist())
        result: list[int] | FitError
        if not names:
            result = FitError(workload.key, state.n, {}, detail="no node offered")
        else:
            term = NodeAffinityTerm(key=NODE_NAME_LABEL, operator="In", values=names)
            base = f"{workload.name[:200]}.topology-trial"
            members = [
                workload.model_copy(update={"name": f"{base}-{i}", "node_affinity": (*workload.node_affinity, term)})
                for i in range(ask.count)
            ]
            try:
                placed = self.scheduler.schedule_gang(members)
            except FitError as exc:
                result = exc
            except ValidationError as exc:
                result = FitError(workload.key, state.n, {}, detail=str(exc))
            else:
                result = [state.index[b.node] for b in placed]
                for binding in reversed(placed):
                    state.forget(binding.workload)
        self._plans[key] = (state.version, result)
        while len(self._plans) > self._keep:
            self._plans.popitem(last=False)
        return result

    def outside_required(self, workload: Workload, ask: TopologyAsk, node: int) -> str | None:
        """Why node `node` breaks the required domain its bound fellow members set (None: it does
        not): bind's last check, as two members may be filtered before either is bound."""
        gang, key = workload.gang, self.gang_key(workload, ask)
        if gang is None or gang.topology is None or gang.topology.required is None or key is None:
            return None
        if not self._bound(key, workload.key):
            return None
        everywhere = np.ones(self.state.n, dtype=bool)
        allowed = self.allowed(workload, ask, everywhere, everywhere)
        return None if allowed.mask is None or allowed.mask[node] else allowed.reason

    def preemption_nodes(self, workload: Workload, ask: TopologyAsk | None) -> Mask | None:
        """The nodes on which member `workload` may have victims evicted for it (None: any): inside
        the domain its bound fellow members set; before any is bound (the first member's eviction
        then sets the domain for the others), on the nodes that carry a required level's label."""
        gang = workload.gang
        if ask is None or gang is None or gang.topology is None:
            return None
        key = self.gang_key(workload, ask)
        if key is not None and self._bound(key, workload.key):
            everywhere = np.ones(self.state.n, dtype=bool)
            return self.allowed(workload, ask, everywhere, everywhere).mask
        topology = self.scheduler.topologies.get(gang.topology.name)
        if topology is None:
            return np.zeros(self.state.n, dtype=bool)
        depth = topology.depth_of(gang.topology.level)
        if gang.topology.required is None or depth is None:
            return None
        return self.scheduler.topology.domains(topology).ids[depth] >= 0
