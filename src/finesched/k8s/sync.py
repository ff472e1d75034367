"""Keeping the extender's state equal to the API server's: list + watch of five kinds (S1.6).

Nodes, Device CRs and NodeResourceTopologies are kept raw per node name; any change to one of
them converts the three again (k8s/nodes.py) and adds, updates or removes the finesched node.
A pod without a resource-status annotation that the NodeResourceTopology's ``pod-cpu-allocs``
lists (the kubelet's static CPU manager pinned it) holds that cpuset.
Pods bound to a node and not finished hold a binding built from their annotations
(k8s/convert.py `pod_binding`), whoever bound them: pods of other schedulers count as used. A
Pod this extender bound confirms the assumed binding (commit) when the API shows it bound.

A bound Pod that cannot be placed yet (its node is unknown, or its amounts do not fit what the
node reports) waits in `waiting` with the reason, and is tried again whenever a node changes;
a node that cannot be converted is left out and its reason kept in `node_problems` (the filter
names it). Kueue's Topology objects (none when the CRD is absent) become the extender's "kueue"
topologies (k8s/kueue.py); one that cannot be converted is left out, its reason kept in
`topology_problems`. Each kind is listed, then watched from the list's resourceVersion; a 410 Gone lists
again and reconciles (objects missing from the new list are deletions).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from finesched.cpuset import CPUSet
from finesched.k8s.api import Gone, KubeAPI
from finesched.k8s.convert import PodError, pod_binding, pod_holds_resources, pod_key
from finesched.k8s.extender import Extender
from finesched.k8s.kueue import kueue_topology
from finesched.k8s.nodes import NodeError, kubelet_cpusets, node_from_k8s
from finesched.plugins.resource_status import ANNOTATION_RESOURCE_STATUS
from finesched.state.cluster import StateError

log = logging.getLogger("finesched.k8s")
NODE_KINDS = ("nodes", "devices", "noderesourcetopologies")


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


class ClusterSync:
    """Applies list and watch results to the extender's state (see the module docstring)."""

    def __init__(self, extender: Extender, api: KubeAPI):
        self.extender = extender
        self.api = api
        self.objects: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in KubeAPI.KINDS}
        self.versions: dict[str, str] = dict.fromkeys(KubeAPI.KINDS, "")
        self.waiting: dict[str, str] = {}
        self.node_problems: dict[str, str] = {}
        self.topology_problems: dict[str, str] = {}
        extender.node_problems = self.node_problems
        self.stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # Pods for bind -------------------------------------------------------------------------------------------
    def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        found = self.objects["pods"].get(f"{namespace}/{name}")
        return found if found is not None else self.api.get_pod(namespace, name)

    # Listing and watching ------------------------------------------------------------------------------------
    def relist(self, kind: str) -> str:
        """List `kind`, apply it as the whole truth (what is gone was deleted); its resourceVersion."""
        items, version = self.api.list(kind)
        with self.extender.lock:
            self._replace(kind, items)
        self.versions[kind] = version
        return version

    def _replace(self, kind: str, items: list[dict[str, Any]], *, reconcile: bool = True) -> set[str]:
        """Make `items` the stored objects of `kind`; the keys that changed (applied unless not `reconcile`)."""
        keyed = {self._key(kind, obj): obj for obj in items}
        stored = self.objects[kind]
        changed = {k for k in stored if k not in keyed}
        changed |= {k for k, obj in keyed.items() if stored.get(k) != obj}
        self.objects[kind] = keyed
        if reconcile:
            if kind == "topologies":
                self._topologies()
                return changed
            for key in sorted(changed):
                if kind == "pods":
                    self._pod(key, keyed.get(key))
                else:
                    self._node(key)
            if kind != "pods":
                self._retry_waiting()
        return changed

    def sync_all(self) -> None:
        """The start-up rebuild: every kind listed; each node converted once, with its Device CR and
        NodeResourceTopology, before any pod is placed."""
        lists = {kind: self.api.list(kind) for kind in KubeAPI.KINDS}
        with self.extender.lock:
            names: set[str] = set()
            for kind in NODE_KINDS:
                names |= self._replace(kind, lists[kind][0], reconcile=False)
            for name in sorted(names):
                self._node(name)
            self._replace("topologies", lists["topologies"][0])
            self._replace("pods", lists["pods"][0])
        for kind, (_, version) in lists.items():
            self.versions[kind] = version
        state = self.extender.state
        log.info(
            "listed %d nodes (%d not usable: %s), %d bound pods held (%d waiting)",
            state.n,
            len(self.node_problems),
            "; ".join(self.node_problems.values()) or "-",
            len(state.bindings),
            len(self.waiting),
        )

    def watch_once(self, kind: str, timeout_seconds: int = 60) -> None:
        """One watch request from the kind's last resourceVersion; on 410 Gone, list again."""
        try:
            for event, obj in self.api.watch(kind, self.versions[kind], timeout_seconds):
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if event != "BOOKMARK":
                    with self.extender.lock:
                        self.apply(kind, event, obj)
                if version:
                    self.versions[kind] = str(version)
                if self.stop.is_set():
                    return
        except Gone as exc:
            log.info("watch of %s: %s; listing again", kind, exc)
            self.relist(kind)

    def start(self, timeout_seconds: int = 60) -> None:
        """List everything, then watch each kind in its own daemon thread until `stop` is set."""
        self.sync_all()
        for kind in KubeAPI.KINDS:
            thread = threading.Thread(target=self._loop, args=(kind, timeout_seconds), daemon=True, name=kind)
            thread.start()
            self._threads.append(thread)

    def close(self, timeout: float = 10.0) -> bool:
        """Stop the watch threads; True when all ended within `timeout` seconds each (a watch ends
        when its server-side timeout passes)."""
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=timeout)
        return not any(thread.is_alive() for thread in self._threads)

    def _loop(self, kind: str, timeout_seconds: int) -> None:
        delay = 0.5
        while not self.stop.is_set():
            try:
                self.watch_once(kind, timeout_seconds)
                delay = 0.5
                if kind == "pods":
                    self.extender.expire()
            except Exception as exc:  # the API server is away: retry with backoff, keep serving
                log.warning("watch of %s failed: %s; retrying in %.1fs", kind, exc, delay)
                self.stop.wait(delay)
                delay = min(delay * 2, 30.0)

    # Applying events ----------------------------------------------------------------------------------------
    @staticmethod
    def _key(kind: str, obj: Mapping[str, Any]) -> str:
        return pod_key(obj) if kind == "pods" else _name(obj)

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        """One ADDED / MODIFIED / DELETED event (call under the extender's lock)."""
        key = self._key(kind, obj)
        if event == "DELETED":
            self.objects[kind].pop(key, None)
        else:
            self.objects[kind][key] = obj
        if kind == "pods":
            self._pod(key, None if event == "DELETED" else obj)
        elif kind == "topologies":
            self._topologies()
        else:
            self._node(key)
            self._retry_waiting()

    def _topologies(self) -> None:
        """Give the extender every Kueue Topology object that converts (the others are logged)."""
        converted = []
        self.topology_problems.clear()
        for name, obj in sorted(self.objects["topologies"].items()):
            try:
                converted.append(kueue_topology(obj))
            except ValueError as exc:
                log.warning("Kueue topology %s left out: %s", name, exc)
                self.topology_problems[name] = str(exc)
        self.extender.set_topologies("kueue", converted)

    def _node(self, name: str) -> None:
        state = self.extender.state
        raw = self.objects["nodes"].get(name)
        if raw is None:
            self.node_problems.pop(name, None)
            if name in state.index:
                for binding in state.remove_node(name, force=True):
                    self.waiting[binding.workload] = f"node {name} is gone"
            return
        try:
            node = node_from_k8s(
                raw, self.objects["devices"].get(name), self.objects["noderesourcetopologies"].get(name)
            )
            if name in state.index:
                state.update_node(node)
            else:
                state.add_node(node)
            self.node_problems.pop(name, None)
        except (NodeError, StateError) as exc:
            log.warning("node %s left as it was: %s", name, exc)
            self.node_problems[name] = str(exc)
            return
        self._repin(name)

    def _repin(self, name: str) -> None:
        """Place again the pods on node `name` whose kubelet cpuset (pod-cpu-allocs) changed."""
        state = self.extender.state
        cpusets = kubelet_cpusets(self.objects["noderesourcetopologies"].get(name))
        for binding in state.bindings_on(name):
            key = binding.workload
            pod = self.objects["pods"].get(key)
            if pod is None or key in self.extender.pending or ANNOTATION_RESOURCE_STATUS in binding.annotations:
                continue
            uid = str((pod.get("metadata") or {}).get("uid", ""))
            if cpusets.get(uid, CPUSet()) != binding.cpuset:
                self.extender.drop(key)
                self._place(key, pod)

    def _pod(self, key: str, pod: dict[str, Any] | None) -> None:
        extender, state = self.extender, self.extender.state
        if pod is None or not pod_holds_resources(pod):
            self.waiting.pop(key, None)
            if key in state.bindings and (pod is None or key not in extender.pending):
                extender.drop(key)  # finished or deleted (an assumed bind not yet visible stays)
            return
        node = str(pod["spec"]["nodeName"])
        existing = state.bindings.get(key)
        if existing is not None:
            if existing.node == node:
                extender.confirm(key, node)
                return
            extender.drop(key)
        self._place(key, pod)

    def _place(self, key: str, pod: dict[str, Any]) -> None:
        state = self.extender.state
        try:
            binding = pod_binding(pod, self.extender.scheduler.framework.owns)
            if binding.node not in state.index:
                self.waiting[key] = f"node {binding.node} is not known (yet)"
                return
            if not binding.cpuset and ANNOTATION_RESOURCE_STATUS not in binding.annotations:
                uid = str((pod.get("metadata") or {}).get("uid", ""))
                pinned = kubelet_cpusets(self.objects["noderesourcetopologies"].get(binding.node)).get(uid)
                if pinned:  # the kubelet's static CPU manager gave this pod exclusive CPUs
                    binding = binding.model_copy(update={"cpuset": pinned})
            state.assume(binding)
            state.commit(key)
        except (PodError, StateError) as exc:
            self.waiting[key] = str(exc)
            log.warning("bound pod %s not counted: %s", key, exc)
            return
        self.waiting.pop(key, None)
        self.extender.uids[key] = str((pod.get("metadata") or {}).get("uid", ""))
        self.extender.note_bound_pod(pod)

    def _retry_waiting(self) -> None:
        for key in list(self.waiting):
            pod = self.objects["pods"].get(key)
            if pod is None or not pod_holds_resources(pod):
                self.waiting.pop(key, None)
            elif key not in self.extender.state.bindings:
                self._place(key, pod)
