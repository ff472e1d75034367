"""finesched: a fine-grained resource scheduler (fractional GPUs, pinned CPUs, NUMA, devices, fairness)."""

from finesched.model import Binding, Job, Manifests, Node, Tenant, Workload, load_manifests, parse_manifest
from finesched.sched.diagnosis import FitError
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

__version__ = "0.1.0"

__all__ = [
    "Binding",
    "ClusterState",
    "FitError",
    "Job",
    "Manifests",
    "Node",
    "Scheduler",
    "Tenant",
    "Workload",
    "__version__",
    "load_manifests",
    "parse_manifest",
]
