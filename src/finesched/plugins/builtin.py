"""Every built-in plugin by its profile name: the registry `Scheduler` uses unless given another.

It lives here, above sched/ (which only knows the `Registry` mechanism), because naming the
plugins imports them; finesched/__init__.py installs it as sched.registry's default.
"""

from __future__ import annotations

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
from finesched.sched.registry import Registry, no_args


def builtin_registry() -> Registry:
    """Every built-in plugin."""
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
