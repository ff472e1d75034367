"""Cluster state: numpy struct-of-arrays over nodes, and the per-node accounts plugins attach."""

from finesched.state.cluster import ClusterState, NodeExtra, NodeObserver, StateError

__all__ = ["ClusterState", "NodeExtra", "NodeObserver", "StateError"]
