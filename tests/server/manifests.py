"""JSON manifests for the control-plane tests (what a client sends)."""

from __future__ import annotations

from typing import Any

API = "finesched.io/v1alpha1"


def node(name: str, cpu: str = "8", memory: str = "32Gi", gpus: int = 0, cores: int = 0, **labels: str) -> dict:
    spec: dict[str, Any] = {"allocatable": {"memory": memory}}
    if cores:  # an explicit topology: 1 socket, `cores` cores x 2 threads
        spec["cpuTopology"] = {"sockets": 1, "numaPerSocket": 1, "coresPerNuma": cores, "threadsPerCore": 2}
    else:
        spec["allocatable"]["cpu"] = cpu
    if gpus:
        spec["devices"] = [
            {"type": "gpu", "minor": i, "uuid": f"GPU-{name}-{i}",
             "resources": {"gpu-core": 100, "gpu-memory-ratio": 100, "gpu-memory": "16Gi"}}
            for i in range(gpus)
        ]  # fmt: skip
    return {"apiVersion": API, "kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": spec}


def workload(name: str, namespace: str = "team-a", cpu: str = "1", memory: str = "1Gi", **spec: Any) -> dict:
    body: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}, **spec}
    return {"apiVersion": API, "kind": "Workload", "metadata": {"name": name, "namespace": namespace}, "spec": body}


def tenant(name: str, weight: float = 1.0, quota: dict[str, Any] | None = None) -> dict:
    spec: dict[str, Any] = {"weight": weight}
    if quota:
        spec["quota"] = quota
    return {"apiVersion": API, "kind": "Tenant", "metadata": {"name": name}, "spec": spec}


def priority_class(name: str, value: int, **spec: Any) -> dict:
    """A PriorityClass manifest (`globalDefault`, `preemptionPolicy`, `description` as keywords)."""
    return {"apiVersion": API, "kind": "PriorityClass", "metadata": {"name": name}, "spec": {"value": value, **spec}}


def tenant_with_classes(name: str, *classes: str) -> dict:
    """Tenant `name` whose workloads may name the PriorityClasses `classes`."""
    return {"apiVersion": API, "kind": "Tenant", "metadata": {"name": name}, "spec": {"priorityClasses": list(classes)}}


def topology(name: str, *labels: str) -> dict:
    """A Topology manifest whose levels are the node labels `labels`, coarse to fine."""
    levels = [{"nodeLabel": label} for label in labels]
    return {"apiVersion": API, "kind": "Topology", "metadata": {"name": name}, "spec": {"levels": levels}}
