"""Fluent builders for test fixtures (the kube-scheduler testing habit).

make_node("n1").cpu("64").memory("256Gi").gpus(8, memory="80Gi").numa(2).obj()
make_workload("w1").req(cpu="2", memory="4Gi").lim(cpu="2").qos("LSR").obj()
"""

from __future__ import annotations

from typing import Any

from finesched.model.node import Node
from finesched.model.workload import Workload


class NodeBuilder:
    def __init__(self, name: str):
        self._data: dict[str, Any] = {"name": name, "allocatable": {}, "labels": {}, "devices": []}

    def cpu(self, amount: str | int) -> NodeBuilder:
        self._data["allocatable"]["cpu"] = amount
        return self

    def memory(self, amount: str | int) -> NodeBuilder:
        self._data["allocatable"]["memory"] = amount
        return self

    def pods(self, amount: int) -> NodeBuilder:
        self._data["allocatable"]["pods"] = amount
        return self

    def res(self, **amounts: str | int) -> NodeBuilder:
        self._data["allocatable"].update({k.replace("_", "-"): v for k, v in amounts.items()})
        return self

    def resource(self, name: str, amount: str | int) -> NodeBuilder:
        self._data["allocatable"][name] = amount
        return self

    def label(self, key: str, value: str) -> NodeBuilder:
        self._data["labels"][key] = value
        return self

    def topology(
        self, sockets: int = 1, numa_per_socket: int = 1, cores_per_numa: int = 4, threads: int = 2
    ) -> NodeBuilder:
        self._data["cpuTopology"] = {
            "sockets": sockets,
            "numaPerSocket": numa_per_socket,
            "coresPerNuma": cores_per_numa,
            "threadsPerCore": threads,
        }
        return self

    def numa(self, count: int, memory: str | None = None) -> NodeBuilder:
        self._data["numaZones"] = [{"id": i, **({"memory": memory} if memory else {})} for i in range(count)]
        return self

    def gpus(
        self, count: int, memory: str | None = "80Gi", numa: list[int] | None = None, healthy: bool = True
    ) -> NodeBuilder:
        start = sum(1 for d in self._data["devices"] if d["type"] == "gpu")
        for k in range(count):
            resources: dict[str, Any] = {"gpu-core": 100, "gpu-memory-ratio": 100}
            if memory is not None:
                resources["gpu-memory"] = memory
            device: dict[str, Any] = {"type": "gpu", "minor": start + k, "health": healthy, "resources": resources}
            if numa is not None:
                device["numa"] = numa[k % len(numa)]
            self._data["devices"].append(device)
        return self

    def device(self, kind: str, minor: int, **fields: Any) -> NodeBuilder:
        self._data["devices"].append({"type": kind, "minor": minor, **fields})
        return self

    def set(self, **fields: Any) -> NodeBuilder:
        self._data.update(fields)
        return self

    def data(self) -> dict[str, Any]:
        return self._data

    def obj(self) -> Node:
        return Node.model_validate(self._data)


class WorkloadBuilder:
    def __init__(self, name: str, namespace: str = "default"):
        self._data: dict[str, Any] = {"name": name, "namespace": namespace, "requests": {}, "limits": {}}

    def req(self, **amounts: str | int) -> WorkloadBuilder:
        self._data["requests"].update({_name(k): v for k, v in amounts.items()})
        return self

    def request(self, name: str, amount: str | int) -> WorkloadBuilder:
        self._data["requests"][name] = amount
        return self

    def lim(self, **amounts: str | int) -> WorkloadBuilder:
        self._data["limits"].update({_name(k): v for k, v in amounts.items()})
        return self

    def qos(self, qos: str) -> WorkloadBuilder:
        self._data["qos"] = qos
        return self

    def tenant(self, tenant: str) -> WorkloadBuilder:
        self._data["tenant"] = tenant
        return self

    def priority(self, priority: int) -> WorkloadBuilder:
        self._data["priority"] = priority
        return self

    def selector(self, **labels: str) -> WorkloadBuilder:
        self._data["nodeSelector"] = labels
        return self

    def gang(self, name: str, min_member: int) -> WorkloadBuilder:
        self._data["gang"] = {"name": name, "minMember": min_member}
        return self

    def set(self, **fields: Any) -> WorkloadBuilder:
        self._data.update(fields)
        return self

    def obj(self) -> Workload:
        return Workload.model_validate(self._data)


def _name(key: str) -> str:
    return key.replace("__", "/").replace("_", "-")


def make_node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


def make_workload(name: str, namespace: str = "default") -> WorkloadBuilder:
    return WorkloadBuilder(name, namespace)
