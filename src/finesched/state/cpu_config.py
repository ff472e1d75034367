"""A node's CPU and NUMA policies, resolved once from its labels, `policies` and kubelet config.

Precedence (seed S3.4, S3.6, S3.7, S3.8; Koordinator `GetNodeCPUBindPolicy` and friends):

* Required bind policy: label ``node.koordinator.sh/cpu-bind-policy`` (or ``policies.cpuBindPolicy``)
  FullPCPUsOnly, *or* a kubelet static policy with full-pcpus-only, makes FullPCPUs required;
  else the label SpreadByPCPUs makes SpreadByPCPUs required; else nothing is required.
* NUMA allocate strategy: label ``node.koordinator.sh/numa-allocate-strategy`` (or
  ``policies.numaAllocateStrategy``), else the kubelet's distribute-cpus-across-numa (->
  DistributeEvenly), else unset (the plugin's default applies).
* NUMA topology policy: label ``node.koordinator.sh/numa-topology-policy``, else the older
  ``node.koordinator.sh/numa-topology-alignment-policy``, else ``policies.numaTopologyPolicy``;
  NodeResourceTopology's ``SingleNUMANodePodLevel`` / ``...ContainerLevel`` forms map to the base policy.
* kubelet compatibility (S3.8): a static kubelet with at least one option and no finesched bind
  policy or NUMA allocate strategy on the node allocates with the kubelet's own functions.

Labels are free text, so a bad value cannot be refused when the node is added; it is kept in
`problems` (each message lists the valid values) and nodes with problems are filtered out, with
that message, for the workloads the policy concerns (exclusive CPUs, NUMA alignment).
Reserved CPUs: the kubelet's ``reservedCPUs``; for a static kubelet without them, its automatic
reservation packed(all CPUs, ceil((capacity - allocatable cpu) / 1000)).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from finesched.hashed import HashedOnce
from finesched.model.node import (
    LABEL_CPU_BIND_POLICY,
    LABEL_NUMA_ALLOCATE_STRATEGY,
    LABEL_NUMA_TOPOLOGY_POLICY,
    LABEL_NUMA_TOPOLOGY_POLICY_OLD,
    NODE_BIND_POLICIES,
    NODE_NUMA_STRATEGIES,
    NUMA_POLICIES,
    Node,
    numa_policy_of,
)
from finesched.model.resources import CPU
from finesched.state.cpu_topology import DISTRIBUTE_EVENLY, FULL_PCPUS, SPREAD_BY_PCPUS, topo_info

#: Policy codes for the vectorized arrays (index into NUMA_POLICIES).
NUMA_POLICY_CODE = {name: k for k, name in enumerate(NUMA_POLICIES)}


@dataclass(frozen=True, slots=True)
class NodeCPUConfig(HashedOnce):
    """What the CPU and NUMA plugins need to know about one node's policies (see the module docstring)."""

    required_bind: str = ""  # "", FullPCPUs or SpreadByPCPUs
    bind_set: bool = False  # a finesched/Koordinator bind policy is set on the node
    numa_strategy: str = ""  # "", MostAllocated, LeastAllocated or DistributeEvenly
    strategy_set: bool = False  # set by label/policies (not derived from the kubelet)
    numa_policy: str = "None"
    kubelet_static: bool = False
    kubelet_mode: bool = False
    full_pcpus_only: bool = False
    distribute_across_numa: bool = False
    align_by_socket: bool = False
    distribute_across_cores: bool = False
    problems: tuple[str, ...] = ()
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    __hash__ = HashedOnce.__hash__  # not the dataclass's: hashed once (finesched/hashed.py)


def _pick(labels: dict[str, str], label: str, fallback: str | None, valid: tuple[str, ...], problems: list[str]) -> str:
    """The label's value if valid (problem noted if not), else the `policies` fallback, else ""."""
    value = labels.get(label)
    if value is not None and value != "":
        if value in valid:
            return value
        problems.append(f"node label {label}={value!r} is not one of {', '.join(valid)}")
    return fallback or ""


def _numa_policy(labels: dict[str, str], fallback: str | None, problems: list[str]) -> str:
    for label in (LABEL_NUMA_TOPOLOGY_POLICY, LABEL_NUMA_TOPOLOGY_POLICY_OLD):
        value = labels.get(label)
        if value is None or value == "":
            continue
        value = numa_policy_of(value)
        if value in NUMA_POLICIES:
            return value
        problems.append(f"node label {label}={value!r} is not one of {', '.join(NUMA_POLICIES)}")
        return "None"
    return fallback or "None"


def node_cpu_config(node: Node) -> NodeCPUConfig:
    """Resolve `node`'s policies (interned: nodes with the same settings share one object)."""
    kubelet = node.kubelet
    return _config(
        tuple(sorted((k, v) for k, v in node.labels.items() if k.startswith("node.koordinator.sh/"))),
        node.policies.cpu_bind_policy,
        node.policies.numa_allocate_strategy,
        node.policies.numa_topology_policy,
        kubelet.cpu_manager_policy,
        tuple(sorted(kubelet.options.items())),
    )


@lru_cache(maxsize=1024)
def _config(
    label_items: tuple[tuple[str, str], ...],
    bind_policy: str | None,
    strategy: str | None,
    numa_policy: str | None,
    kubelet_policy: str,
    options: tuple[tuple[str, bool], ...],
) -> NodeCPUConfig:
    labels = dict(label_items)
    opts = dict(options)
    problems: list[str] = []
    bind = _pick(labels, LABEL_CPU_BIND_POLICY, bind_policy, NODE_BIND_POLICIES, problems)
    node_strategy = _pick(labels, LABEL_NUMA_ALLOCATE_STRATEGY, strategy, NODE_NUMA_STRATEGIES, problems)
    static = kubelet_policy == "static"
    full = static and opts.get("full-pcpus-only", False)
    distribute = static and opts.get("distribute-cpus-across-numa", False)
    required = FULL_PCPUS if bind == "FullPCPUsOnly" or full else SPREAD_BY_PCPUS if bind == "SpreadByPCPUs" else ""
    bind_set = bind not in ("", "None")
    return NodeCPUConfig(
        required_bind=required,
        bind_set=bind_set,
        numa_strategy=node_strategy or (DISTRIBUTE_EVENLY if distribute else ""),
        strategy_set=bool(node_strategy),
        numa_policy=_numa_policy(labels, numa_policy, problems),
        kubelet_static=static,
        kubelet_mode=static and any(opts.values()) and not bind_set and not node_strategy,
        full_pcpus_only=full,
        distribute_across_numa=distribute,
        align_by_socket=static and opts.get("align-by-socket", False),
        distribute_across_cores=static and opts.get("distribute-cpus-across-cores", False),
        problems=tuple(problems),
    )


def reserved_cpus(node: Node) -> frozenset[int]:
    """The CPUs no exclusive cpuset may take on `node` (see the module docstring)."""
    from finesched.state.cpu_packed import kubelet_reserved_cpus

    if node.kubelet.reserved_cpus:
        return frozenset(node.kubelet.reserved_cpus)
    topo = node.cpu_topology
    if topo is None or node.kubelet.cpu_manager_policy != "static":
        return frozenset()
    capacity = 1000 * len(topo.cpus)
    count = -(-(capacity - node.allocatable.get(CPU, capacity)) // 1000)
    return frozenset(kubelet_reserved_cpus(topo_info(topo), count)) if count > 0 else frozenset()
