"""Building the extender: a Scheduler over nodes from finesched manifests (``--cluster``) or none yet
(the API server's watches add them), with auto_commit off so binds commit only after the API write."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from finesched.k8s.extender import Binder, Extender, PodSource
from finesched.k8s.nodes import with_name_label
from finesched.model.manifest import load_manifests
from finesched.model.node import Node
from finesched.model.topology import Topology
from finesched.sched.profile import Profile
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState


def build_extender(
    nodes: Iterable[Node] = (),
    *,
    profile: str | Profile = "default",
    binder: Binder | None = None,
    pod_source: PodSource | None = None,
    assume_ttl: float = 300.0,
    topologies: Iterable[Topology] = (),
) -> Extender:
    """`topologies`: finesched Topology manifests (``--topology``, ``--cluster``), the extender's
    "manifests" topologies; Kueue's Topology objects are added by the sync."""
    state = ClusterState.from_nodes([with_name_label(n) for n in nodes])
    # memoize=False: binds pin a pod to one node through a selector, a new request shape per node.
    scheduler = Scheduler(state, profile, auto_commit=False, memoize=False)
    extender = Extender(scheduler, binder, pod_source=pod_source, assume_ttl=assume_ttl)
    extender.set_topologies("manifests", list(topologies))
    return extender


def extender_from_manifests(*paths: str | Path, profile: str | Profile = "default") -> Extender:
    """``--cluster FILE``: the nodes (and topologies) of finesched manifests, no API server (binds
    commit at once)."""
    manifests = load_manifests(*paths)
    return build_extender(manifests.nodes, profile=profile, topologies=manifests.topologies)
