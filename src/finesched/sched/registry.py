"""Plugin registry: name -> factory, built explicitly (nothing registers itself at import time).

A factory takes the plugin's `args` from the profile and returns a plugin; it must be pure (no
threads, no I/O), so the simulator and tests can build plugins freely. The driver attaches
plugins to a ClusterState afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from finesched.errors import ValidationError
from finesched.sched.framework import Plugin

Factory = Callable[[Mapping[str, Any]], Plugin]


def no_args(cls: type) -> Factory:
    """A factory for a plugin that takes no arguments (any given is an error)."""

    def build(args: Mapping[str, Any]) -> Plugin:
        if args:
            raise ValidationError(f"{cls.NAME} takes no args", path="args", value=dict(args))
        return cls()

    return build


class Registry:
    def __init__(self, factories: Mapping[str, Factory]):
        self._factories = dict(factories)

    def names(self) -> list[str]:
        return sorted(self._factories)

    def create(self, name: str, args: Mapping[str, Any]) -> Plugin:
        factory = self._factories.get(name)
        if factory is None:
            raise ValidationError(f"unknown plugin; valid plugins: {', '.join(self.names())}", path="name", value=name)
        return factory(args)

    def with_plugins(self, factories: Mapping[str, Factory]) -> Registry:
        """A registry with extra (or replaced) factories, e.g. a simulator's own policies."""
        return Registry({**self._factories, **factories})


def default_registry() -> Registry:
    """Every built-in plugin."""
    from finesched.plugins.bucket_fit import BucketFit
    from finesched.plugins.cpu_orchestration import CPUOrchestration
    from finesched.plugins.deviceshare import DeviceShare
    from finesched.plugins.deviceshare.scoring import DeviceScore
    from finesched.plugins.fragmentation import FGDScore
    from finesched.plugins.node_selector import NodeSelector
    from finesched.plugins.node_unschedulable import NodeUnschedulable
    from finesched.plugins.numa import NUMAAlign
    from finesched.plugins.preemption import DefaultPreemption
    from finesched.plugins.resources_fit import ResourcesFit
    from finesched.plugins.scoring import LeastRequested, MostAllocated, MostBalanced
    from finesched.plugins.tenant_isolation import TenantIsolation

    return Registry(
        {
            "NodeSelector": no_args(NodeSelector),
            "NodeUnschedulable": no_args(NodeUnschedulable),
            "TenantIsolation": no_args(TenantIsolation),
            "ResourcesFit": no_args(ResourcesFit),
            "LeastRequested": no_args(LeastRequested),
            "MostAllocated": no_args(MostAllocated),
            "MostBalanced": no_args(MostBalanced),
            "BucketFit": BucketFit.from_args,
            "DeviceShare": DeviceShare.from_args,
            "DeviceScore": DeviceScore.from_args,
            "FGD": FGDScore.from_args,
            "NUMAAlign": NUMAAlign.from_args,
            "CPUOrchestration": CPUOrchestration.from_args,
            "DefaultPreemption": DefaultPreemption.from_args,
        }
    )
