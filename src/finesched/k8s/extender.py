"""The extender's verbs over one Scheduler: filter, prioritize, bind, preempt (PROTOCOLS.md section 1).

* filter: the Pod is converted (a bad Pod or annotation fails every node with a reason that names
  the annotation and field, in FailedAndUnresolvableNodes: no preemption fixes a typo) and judged
  on every node (k8s/assess.py); nodes finesched does not know are unresolvable too.
* prioritize: the same assessment's scores, 0..10 (kube-scheduler multiplies by weight x 10).
* bind: the Pod (remembered from filter, else asked of the `PodSource`) is placed on the node
  kube-scheduler chose through `Scheduler.schedule_one` with a selector pinning it there
  (auto_commit off), so the exact devices and cpuset are decided by the same plugins. Then the
  `Binder` patches the annotations and creates the Binding; if that fails (409 conflict or any
  API error) the binding is released and the error returned, and kube-scheduler retries. A
  binding whose Pod the API never shows as bound expires after `assume_ttl` seconds (as
  kube-scheduler's cache expires assumed pods); `confirm` commits it when the watch sees it.
* topology gangs (Kueue's TAS annotations on a Kueue pod group, k8s/kueue.py): filter keeps a
  member to the nodes of its gang's domain (k8s/gangs.py: the first member's domain is chosen by
  placing the whole gang with `Scheduler.schedule_gang`, later members follow the bound ones),
  prioritize scores nodes outside it 0, and bind refuses a node outside a required domain.
  Topologies come from `set_topologies` (finesched manifests, Kueue Topology objects).
* preempt: a candidate node is kept when the Pod fits there once the victims finesched knows on
  it are gone (released, tested, and assumed again, all under the lock).

Every verb runs under one lock (the watches take it too). No verb raises for bad input: errors go
into the reply's Error field.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from finesched.errors import ValidationError
from finesched.k8s.assess import Assessor
from finesched.k8s.convert import PodError, pod_key, pod_workload
from finesched.k8s.gangs import TopologyGangs
from finesched.k8s.kueue import TopologyAsk, topology_ask, with_topology_gang
from finesched.k8s.nodes import NODE_NAME_LABEL, NodeError, node_from_k8s
from finesched.k8s.wire import BindingArgs, ExtenderArgs, Victims, filter_result
from finesched.model.base import FrozenDict
from finesched.model.binding import Binding
from finesched.model.device_allocated import DEVICE_ALLOCATED, format_device_allocated
from finesched.model.topology import Topology
from finesched.model.workload import Workload
from finesched.plugins.resource_status import ANNOTATION_RESOURCE_STATUS
from finesched.sched.diagnosis import FitError
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import StateError

log = logging.getLogger("finesched.k8s")

UNKNOWN_NODE = "node unknown to finesched"


class BindError(Exception):
    """The API refused the bind (`conflict`: HTTP 409, someone else changed or bound the Pod)."""

    def __init__(self, message: str, conflict: bool = False):
        super().__init__(message)
        self.conflict = conflict


class Binder(Protocol):
    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        """Patch the Pod's annotations, then create its Binding; raise BindError on failure."""


PodSource = Callable[[str, str], Mapping[str, Any] | None]


def binding_annotations(binding: Binding) -> dict[str, str]:
    """The Koordinator annotations a bound Pod carries: device-allocated and resource-status."""
    out: dict[str, str] = {}
    if binding.devices:
        out[DEVICE_ALLOCATED] = format_device_allocated(binding.devices)
    status = binding.annotations.get(ANNOTATION_RESOURCE_STATUS)
    if status:
        out[ANNOTATION_RESOURCE_STATUS] = status
    return out


class Extender:
    """The four verbs (see the module docstring)."""

    def __init__(
        self,
        scheduler: Scheduler,
        binder: Binder | None = None,
        *,
        pod_source: PodSource | None = None,
        assume_ttl: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if scheduler.auto_commit:
            raise ValueError("the extender's scheduler must have auto_commit=False (the API write commits)")
        self.scheduler = scheduler
        self.state = scheduler.state
        self.binder = binder
        self.pod_source = pod_source
        self.assume_ttl = assume_ttl
        self.clock = clock
        self.lock = threading.RLock()
        self.assessor = Assessor(scheduler)
        #: Pods seen in filter/prioritize calls by UID (bind is given names only), most recent last.
        self._pods: OrderedDict[str, Mapping[str, Any]] = OrderedDict()
        self._workloads: OrderedDict[tuple[str, str, str, int], tuple[Workload, TopologyAsk | None] | PodError] = (
            OrderedDict()
        )
        #: Topology gangs: membership and domain choice (k8s/gangs.py).
        self.gangs = TopologyGangs(scheduler)
        #: Topologies by source ("manifests": --topology/--cluster files, "kueue": Kueue's objects).
        self._topology_sources: dict[str, list[Topology]] = {}
        self._topology_version = 0
        #: Workload key -> UID of every Pod holding a binding (preemption names victims by UID).
        self.uids: dict[str, str] = {}
        #: Assumed bindings waiting for the API to show the Pod bound: key -> deadline.
        self.pending: dict[str, float] = {}
        self._lists: OrderedDict[tuple[int, tuple[str, ...]], npt.NDArray[np.intp]] = OrderedDict()
        #: The last list object asked about, its node-set version and positions.
        self._last_list: tuple[list[str], int, npt.NDArray[np.intp]] | None = None
        #: Nodes the API has but finesched could not convert: name -> why (set by the sync).
        self.node_problems: Mapping[str, str] = {}
        #: Nodes learned from full-Nodes requests (nodeCacheCapable: false): name -> resourceVersion
        #: seen, and those that could not be converted: name -> why.
        self._learned: dict[str, str] = {}
        self._learn_problems: dict[str, str] = {}

    # Topologies --------------------------------------------------------------------------------------------
    def set_topologies(self, source: str, topologies: list[Topology]) -> None:
        """Replace the topologies of `source`; the scheduler gets them all ("manifests" wins a name
        both sources use: the operator gave it on the command line)."""
        with self.lock:
            self._topology_sources[source] = list(topologies)
            merged: dict[str, Topology] = {}
            for name in ("kueue", *sorted(s for s in self._topology_sources if s not in ("kueue", "manifests")),
                         "manifests"):  # fmt: skip
                merged.update((t.name, t) for t in self._topology_sources.get(name, ()))
            self.scheduler.set_topologies(merged.values())
            self._topology_version += 1

    # Pods --------------------------------------------------------------------------------------------------
    def workload(self, pod: Any) -> Workload:
        """The Pod's Workload (cached by UID and resourceVersion); raise PodError for a bad Pod."""
        return self.workload_and_ask(pod)[0]

    def workload_and_ask(self, pod: Any) -> tuple[Workload, TopologyAsk | None]:
        """The Pod's Workload, a topology gang's member when Kueue's TAS annotations ask for a domain,
        and that ask; raise PodError for a bad Pod or annotation."""
        meta = pod.get("metadata") if isinstance(pod, dict) else None
        if not isinstance(meta, dict):
            raise PodError("Pod: expected an object with metadata")
        key = pod_key(pod)
        ident = (str(meta.get("uid", "")), str(meta.get("resourceVersion", "")), key, self._topology_version)
        found = self._workloads.get(ident)
        if found is None:
            try:
                workload = pod_workload(pod)
                ask = topology_ask(workload.labels, dict(meta.get("annotations") or {}))
                if ask is not None:
                    workload = with_topology_gang(workload, ask, self.scheduler.topologies)
                found = (workload, ask)
            except PodError as exc:
                found = exc
            self._workloads[ident] = found
            if len(self._workloads) > 4096:
                self._workloads.popitem(last=False)
            if meta.get("uid"):
                self._pods[str(meta["uid"])] = pod
                if len(self._pods) > 4096:
                    self._pods.popitem(last=False)
        if isinstance(found, PodError):
            raise found
        workload, ask = found
        if ask is not None and ask.group is not None:
            self.gangs.note(key, f"{workload.namespace}/{ask.group}", ask.index)
        return found

    def note_bound_pod(self, pod: Mapping[str, Any]) -> None:
        """A bound Pod the sync placed: remember its pod group (later members join its domain)."""
        meta = pod.get("metadata") or {}
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        try:
            ask = topology_ask(labels, annotations)
        except PodError:
            return
        if ask is not None and ask.group is not None:
            self.gangs.note(pod_key(pod), f"{meta.get('namespace') or 'default'}/{ask.group}", ask.index)

    # Filter and prioritize --------------------------------------------------------------------------------
    def learn_nodes(self, nodes: list[dict[str, Any]] | None) -> None:
        """With `nodeCacheCapable: false` kube-scheduler sends the Node objects themselves: a node
        finesched does not know yet is added from its Node object alone (labels, allocatable, GPUs
        advertised in allocatable), and updated when its resourceVersion changes. Nodes known
        through the API watch or `--cluster` keep that richer source (Device CR, NRT)."""
        for doc in nodes or ():
            meta = doc.get("metadata") or {}
            name, version = str(meta.get("name", "")), str(meta.get("resourceVersion", ""))
            known = name in self.state.index
            if not name or (known and name not in self._learned) or self._learned.get(name) == version:
                continue
            try:
                node = node_from_k8s(doc)
                if known:
                    self.state.update_node(node)
                else:
                    self.state.add_node(node)
            except (NodeError, StateError) as exc:
                self._learn_problems[name] = str(exc)
                continue
            self._learned[name] = version
            self._learn_problems.pop(name, None)

    def filter(self, args: ExtenderArgs) -> dict[str, Any]:
        with self.lock:
            self.expire()
            self.learn_nodes(args.nodes)
            try:
                workload, ask = self.workload_and_ask(args.pod)
            except PodError as exc:
                reason = f"invalid pod: {exc}"
                return filter_result(args, [], {}, dict.fromkeys(args.names, reason))
            names = args.names
            positions = self._positions(names)
            known = positions >= 0
            if ask is not None:
                self.gangs.prepare(workload, ask, self._offered(positions))
            assessment = self.assessor.assess(workload, self._identity(args.pod))
            ok = np.zeros(len(names), dtype=bool)
            ok[known] = assessment.feasible[positions[known]]
            domain = self._domain(workload, ask, positions, assessment.feasible)
            failed: dict[str, str] = {}
            unresolvable: dict[str, str] = {}
            for position in np.flatnonzero(~ok).tolist():
                name, i = names[position], int(positions[position])
                if i < 0:
                    problem = self.node_problems.get(name) or self._learn_problems.get(name)
                    unresolvable[name] = f"{UNKNOWN_NODE}: {problem}" if problem else UNKNOWN_NODE
                else:
                    reason, final = assessment.reason(i)
                    (unresolvable if final else failed)[name] = reason
            if domain is not None:
                mask, reason = domain
                for position in np.flatnonzero(ok & known).tolist():
                    i = int(positions[position])
                    if not mask[i]:
                        ok[position] = False
                        failed[names[position]] = reason
            passed = range(len(names)) if ok.all() else np.flatnonzero(ok).tolist()
            return filter_result(args, passed, failed, unresolvable)

    def _offered(self, positions: npt.NDArray[np.intp]) -> npt.NDArray[np.bool_]:
        offered = np.zeros(self.state.n, dtype=bool)
        offered[positions[positions >= 0]] = True
        return offered

    def _domain(
        self,
        workload: Workload,
        ask: TopologyAsk | None,
        positions: npt.NDArray[np.intp],
        feasible: npt.NDArray[np.bool_],
    ) -> tuple[npt.NDArray[np.bool_], str] | None:
        """The nodes a topology gang's member may take and why the others not (None: anywhere)."""
        if ask is None:
            return None
        allowed = self.gangs.allowed(workload, ask, self._offered(positions), feasible)
        if allowed.mask is None:
            return None
        mask = np.zeros(self.state.n, dtype=bool)
        mask[: len(allowed.mask)] = allowed.mask[: self.state.n]
        return mask, allowed.reason

    def prioritize(self, args: ExtenderArgs) -> list[int]:
        """Each of `args.names`' score 0..10 (0 for unknown nodes and for a Pod that cannot be read)."""
        with self.lock:
            self.learn_nodes(args.nodes)
            try:
                workload, ask = self.workload_and_ask(args.pod)
            except PodError:
                return [0] * len(args.names)
            positions = self._positions(args.names)
            if ask is not None:
                self.gangs.prepare(workload, ask, self._offered(positions))
            assessment = self.assessor.assess(workload, self._identity(args.pod))
            scores = assessment.scores()
            domain = self._domain(workload, ask, positions, assessment.feasible)
            if domain is not None:
                scores = np.where(domain[0], scores, 0)
            return np.where(positions >= 0, scores[positions], 0).tolist()

    def _positions(self, names: list[str]) -> npt.NDArray[np.intp]:
        """State indices of `names` (-1 for unknown ones). kube-scheduler sends the same list again
        and again (every feasible node), so the last few lists are kept while the node set stays."""
        last = self._last_list
        if last is not None and last[0] is names and last[1] == self.state.nodes_version:
            return last[2]  # the very list again (wire.same_names): no hashing of its names
        key = (self.state.nodes_version, tuple(names))
        found = self._lists.get(key)
        if found is None:
            get = self.state.index.get
            found = np.array([get(n, -1) for n in names], dtype=np.intp)
            self._lists[key] = found
            while len(self._lists) > 4:
                self._lists.popitem(last=False)
        self._last_list = (names, self.state.nodes_version, found)
        return found

    @staticmethod
    def _identity(pod: Mapping[str, Any]) -> tuple[str, str, str]:
        meta = pod.get("metadata") or {}
        return (str(meta.get("uid", "")), str(meta.get("resourceVersion", "")), pod_key(pod))

    # Bind --------------------------------------------------------------------------------------------------
    def bind(self, args: BindingArgs) -> str:
        """Bind the Pod; the error text ("" on success)."""
        key = f"{args.namespace}/{args.pod_name}"
        with self.lock:
            self.expire()
            pod = self._pods.get(args.uid) if args.uid else None
            if pod is None and self.pod_source is not None:
                pod = self.pod_source(args.namespace, args.pod_name)
            if pod is None:
                return f"pod {key} (uid {args.uid or '?'}) is unknown: it was never filtered by this extender"
            if args.node not in self.state.index:
                return f"bind {key}: {UNKNOWN_NODE}: {args.node}"
            existing = self.state.bindings.get(key)
            if existing is not None:
                if existing.node == args.node and key in self.pending:
                    return ""  # a retried bind of what we already bound
                return f"bind {key}: already bound to {existing.node}"
            try:
                workload, ask = self.workload_and_ask(pod)
            except PodError as exc:
                return f"bind {key}: invalid pod: {exc}"
            outside = self.gangs.outside_required(workload, ask, self.state.index[args.node]) if ask else None
            if outside is not None:
                return f"bind {key} to {args.node}: {outside}"
            # the gang's domain was kept by filter: the member is placed on its node alone
            pin = FrozenDict({NODE_NAME_LABEL: args.node})
            pinned = workload.model_copy(update={"gang": None, "node_selector": pin})
            try:
                binding = self.scheduler.schedule_one(pinned)
            except FitError as exc:
                return f"bind {key}: does not fit on {args.node}: {exc.message}"
            except ValidationError as exc:
                return f"bind {key}: {exc}"
            uid = args.uid or str((pod.get("metadata") or {}).get("uid", ""))
            self.uids[key] = uid
            if self.binder is None:  # --cluster mode: no API to write, the decision is final
                self.state.commit(key)
                return ""
            self.pending[key] = self.clock() + self.assume_ttl
        # The API calls run outside the lock: filter calls for other pods go on meanwhile.
        try:
            self.binder.bind(args.namespace, args.pod_name, uid, args.node, binding_annotations(binding))
        except BindError as exc:
            with self.lock:
                self.drop(key)
            return f"bind {key} to {args.node}: {exc}"
        return ""

    def drop(self, key: str) -> None:
        """Forget what finesched holds for Pod `key` (released, no longer pending)."""
        self.pending.pop(key, None)
        self.uids.pop(key, None)
        self.gangs.forget(key)
        if key in self.state.bindings:
            self.scheduler.release(key)

    def confirm(self, key: str, node: str) -> bool:
        """The API shows Pod `key` bound to `node`: commit our assumed binding. False if we hold none."""
        with self.lock:
            binding = self.state.bindings.get(key)
            if binding is None or binding.node != node:
                return False
            self.pending.pop(key, None)
            self.state.commit(key)
            return True

    def expire(self) -> list[str]:
        """Release assumed bindings whose Pod the API never showed bound within `assume_ttl`."""
        now = self.clock()
        with self.lock:  # the watch thread calls this too: read `pending` under the lock
            gone = [key for key, deadline in self.pending.items() if deadline <= now]
            for key in gone:
                log.warning("assumed binding of %s expired: the API never showed the pod bound", key)
                self.drop(key)
        return gone

    # Preempt -----------------------------------------------------------------------------------------------
    def preempt(self, pod: Any, candidates: Mapping[str, Victims]) -> dict[str, Victims]:
        """The candidates on which the Pod fits once the victims are gone, each with the fewest
        victims needed: kube-scheduler's victims are reprieved one by one, highest priority first,
        while the Pod still fits without them (device shares and cpusets decide, not just counts).
        A member of a topology gang keeps only candidates inside its gang's domain
        (`TopologyGangs.preemption_nodes`), so a gang's evictions stay in one domain."""
        with self.lock:
            workload, ask = self.workload_and_ask(pod)
            inside = self.gangs.preemption_nodes(workload, ask)  # a topology gang evicts in its domain
            by_uid = {uid: key for key, uid in self.uids.items()}
            kept: dict[str, Victims] = {}
            for node, victims in candidates.items():
                i = self.state.index.get(node)
                if i is None or (inside is not None and not inside[i]):
                    continue
                evict = [u for u in victims.uids if u in by_uid]
                if not self._fits_without(workload, i, [by_uid[u] for u in evict]):
                    continue
                for uid in sorted(evict, key=lambda u: -self._priority(by_uid[u])):
                    rest = [u for u in evict if u != uid]
                    if self._fits_without(workload, i, [by_uid[u] for u in rest]):
                        evict = rest  # not needed: reprieved
                # victims finesched does not know (no binding here) are kept as kube-scheduler chose
                unknown = [u for u in victims.uids if u not in by_uid]
                kept[node] = Victims(evict + unknown, victims.pdb_violations)
            return kept

    def _priority(self, key: str) -> int:
        binding = self.state.bindings.get(key)
        return binding.priority if binding is not None else 0

    def _fits_without(self, workload: Workload, i: int, keys: list[str]) -> bool:
        state = self.state
        node = state.names[i]
        taken: list[tuple[Binding, bool]] = []
        for key in keys:
            binding = state.bindings.get(key)
            if binding is not None and binding.node == node:
                taken.append((binding, state.is_committed(key)))
                self.scheduler.release(key)
        try:
            return bool(self.assessor.assess(workload, ("preempt", workload.key, node)).feasible[i])
        finally:
            for binding, committed in taken:
                try:
                    state.assume(binding)
                    if committed:
                        state.commit(binding.workload)
                except StateError as exc:  # cannot happen: it held exactly these amounts a moment ago
                    log.error("could not restore %s after a preemption check: %s", binding.workload, exc)
