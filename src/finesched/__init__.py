"""finesched: a fine-grained resource scheduler (fractional GPUs, pinned CPUs, NUMA, devices, fairness)."""

from finesched.model import Binding, Job, Manifests, Node, Tenant, Workload, load_manifests, parse_manifest
from finesched.plugins.builtin import builtin_registry
from finesched.sched.diagnosis import FitError
from finesched.sched.registry import install_builtin
from finesched.sched.scheduler import Scheduler
from finesched.state.cluster import ClusterState

# The package is where the layers meet: sched/ (below the plugins) gets the built-in plugin set
# here, before anything can build a Scheduler (Python runs this file before any of its modules).
install_builtin(builtin_registry)

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
