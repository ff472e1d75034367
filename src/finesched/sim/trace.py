"""Loaders for the Alibaba cluster-trace-gpu-v2023 ("openb") node and pod lists, and their mapping
onto finesched Nodes and Workloads.

Trace: Alibaba cluster-trace-gpu-v2023, used by Weng et al., "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC 2023 (see
data/alibaba-gpu-v2023/README.md for provenance and citation).

* Node lists (``openb_node_list_*.csv``): ``sn,cpu_milli,memory_mib,gpu,model``.
* Pod lists (``openb_pod_list_*.csv``): ``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` and, in all
  but the multigpu variants, ``gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time``.

Every malformed row is rejected with its file and line number (`TraceError`). The mapping:

* a node gets cpu, memory (MiB -> bytes) and one ``gpu`` device per trace GPU with gpu-core 100
  and gpu-memory-ratio 100 (1000 trace milli = 100 %; gpu-memory from `GPU_MEMORY_BY_MODEL`), and
  its model as label ``gpu-model``; with a partition policy (``sim fill --gpu-partitions``) also a
  GPU partition table of aligned power-of-two blocks (`partition_table`) under that policy;
* a share pod (one GPU, ``gpu_milli`` d < 1000) asks ``gpu-core: d/10`` and
  ``gpu-memory-ratio: d/10`` (the trace's milli values are multiples of 10); a pod of k whole GPUs
  asks ``nvidia.com/gpu: k``; ``gpu_spec`` "A|B" becomes the node affinity
  ``gpu-model In [A, B]``; the tenant is the pod's QoS class (``LS``, ``BE``, ...).
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import TypeAdapter
from pydantic import ValidationError as PydanticValidationError

from finesched.model.base import fast_copy
from finesched.model.names import ObjectName
from finesched.model.node import Node
from finesched.model.workload import Workload

IntArray = npt.NDArray[np.int64]

GPU_MODEL_LABEL = "gpu-model"
MILLI_PER_GPU = 1000
#: Pods a trace node may hold (the trace has no such limit; kept far above any real count).
MAX_PODS_PER_NODE = 100_000
MISSING_TIME = -1
#: GPU memory per card. The trace states no memory sizes and asks only ratios, so these only let the
#: device plugin turn a gpu-memory-ratio share into bytes: the sizes the model names or vendors state
#: (V100M16/M32, P100, T4, A10) and a nominal 32Gi for the undisclosed G1/G2/G3 and unknown models.
GPU_MEMORY_BY_MODEL = {"V100M16": "16Gi", "V100M32": "32Gi", "P100": "16Gi", "T4": "16Gi", "A10": "24Gi"}
NOMINAL_GPU_MEMORY = "32Gi"

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_OPTIONAL = ("gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time")


class TraceError(ValueError):
    """A trace file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class NodeTable:
    """The node list as columns (index i = row i)."""

    names: tuple[str, ...]
    cpu_milli: IntArray
    memory_mib: IntArray
    gpus: IntArray
    models: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.names)

    @property
    def gpu_capacity_milli(self) -> int:
        return int(self.gpus.sum()) * MILLI_PER_GPU


@dataclass(frozen=True)
class PodTable:
    """The pod list as columns. Times are seconds, `MISSING_TIME` where the trace has none."""

    names: tuple[str, ...]
    cpu_milli: IntArray
    memory_mib: IntArray
    num_gpu: IntArray
    gpu_milli: IntArray
    gpu_spec: tuple[str, ...]
    qos: tuple[str, ...]
    creation: IntArray
    deletion: IntArray
    scheduled: IntArray
    has_times: bool
    source: str = ""

    def __len__(self) -> int:
        return len(self.names)

    @property
    def gpu_request_milli(self) -> IntArray:
        """[P] k·d per pod (total GPU milli asked)."""
        return self.num_gpu * self.gpu_milli

    def take(self, order: Sequence[int] | npt.NDArray[np.intp], names: Sequence[str] | None = None) -> PodTable:
        """Rows `order` (repeats allowed), optionally renamed."""
        idx = np.asarray(order, dtype=np.intp)
        pick: Callable[[tuple[str, ...]], tuple[str, ...]] = lambda col: tuple(col[i] for i in idx.tolist())  # noqa: E731
        return PodTable(
            names=tuple(names) if names is not None else pick(self.names),
            cpu_milli=self.cpu_milli[idx],
            memory_mib=self.memory_mib[idx],
            num_gpu=self.num_gpu[idx],
            gpu_milli=self.gpu_milli[idx],
            gpu_spec=pick(self.gpu_spec),
            qos=pick(self.qos),
            creation=self.creation[idx],
            deletion=self.deletion[idx],
            scheduled=self.scheduled[idx],
            has_times=self.has_times,
            source=self.source,
        )


# Reading -----------------------------------------------------------------------------------------------
def _rows(path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (line where the row starts, row by column) for every non-blank data row.

    ``reader.line_num`` counts the lines read so far, i.e. where a row *ends*. Trace fields never
    contain newlines, so a row that spans lines means a quote opened on its first line was never
    closed (the reader then swallows the following lines, and reports a field-size or field-count
    problem far away). Such rows are reported at the line they start on, as what they are.
    """
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with handle:
        reader = csv.reader(handle)
        try:
            header = next(reader)
        except StopIteration:
            raise TraceError(f"{path}:1: empty file (expected a header: {','.join(required)})") from None
        except csv.Error as exc:
            if reader.line_num > 1:
                raise _unterminated(path, 1, reader.line_num, str(exc)) from None
            raise TraceError(f"{path}:1: not a CSV file ({exc})") from None
        except UnicodeDecodeError as exc:
            raise TraceError(f"{path}:1: not a CSV file ({exc})") from None
        if reader.line_num > 1:
            raise _unterminated(path, 1, reader.line_num)
        header = [h.strip() for h in header]
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(f"{path}:1: header lacks column(s) {', '.join(missing)} (has: {','.join(header)})")
        start = reader.line_num + 1
        try:
            for row in reader:
                line, start = start, reader.line_num + 1
                if reader.line_num > line:
                    raise _unterminated(path, line, reader.line_num)
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != len(header):
                    raise TraceError(f"{path}:{line}: {len(row)} fields, the header has {len(header)}")
                yield line, dict(zip(header, row, strict=True))
        except csv.Error as exc:
            if reader.line_num > start:
                raise _unterminated(path, start, reader.line_num, str(exc)) from None
            raise TraceError(f"{path}:{start}: malformed CSV ({exc})") from None
        except UnicodeDecodeError as exc:
            raise TraceError(f"{path}:{start}: malformed CSV ({exc})") from None


def _unterminated(path: Path, start: int, end: int, cause: str = "") -> TraceError:
    """The error for a row that runs from line `start` on to line `end` (an unclosed quote)."""
    reader_said = f"; the CSV reader stopped at line {end}: {cause}" if cause else f"; the row runs on to line {end}"
    return TraceError(f"{path}:{start}: unterminated quote starting on line {start}{reader_said}")


def _new_name(path: Path, line: int, text: str, column: str, what: str, seen: dict[str, int]) -> str:
    """A row's name, stripped: not empty and not seen before in the file (`seen` maps name -> line)."""
    name = text.strip()
    if not name:
        raise TraceError(f"{path}:{line}: {column} is empty")
    if name in seen:
        raise TraceError(f"{path}:{line}: duplicate {what} {name!r} (first on line {seen[name]})")
    seen[name] = line
    return name


def _int(path: Path, line: int, row: dict[str, str], column: str, *, optional: bool = False) -> int:
    text = row.get(column, "").strip()
    if not text and optional:
        return MISSING_TIME
    try:
        value = int(text)
    except ValueError:
        try:
            as_float = float(text)
        except ValueError:
            as_float = float("nan")
        if not as_float.is_integer():
            raise TraceError(f"{path}:{line}: {column} must be an integer, got {text!r}") from None
        value = int(as_float)
    if value < 0:
        raise TraceError(f"{path}:{line}: {column} must be >= 0, got {value}")
    return value


def load_nodes(path: str | Path) -> NodeTable:
    """Read a node list; every malformed row raises `TraceError` naming its line."""
    path = Path(path)
    names: list[str] = []
    cols: dict[str, list[int]] = {"cpu_milli": [], "memory_mib": [], "gpu": []}
    models: list[str] = []
    seen: dict[str, int] = {}
    for line, row in _rows(path, NODE_COLUMNS):
        name = _new_name(path, line, row["sn"], "sn (node name)", "node", seen)
        for column in cols:
            cols[column].append(_int(path, line, row, column))
        model = row["model"].strip()
        if model.lower() == "nan":
            model = ""
        if cols["gpu"][-1] > 0 and not model:
            raise TraceError(f"{path}:{line}: node {name} has {cols['gpu'][-1]} GPUs but no model")
        names.append(name)
        models.append(model)
    if not names:
        raise TraceError(f"{path}: no nodes")
    return NodeTable(
        names=tuple(names),
        cpu_milli=np.asarray(cols["cpu_milli"], dtype=np.int64),
        memory_mib=np.asarray(cols["memory_mib"], dtype=np.int64),
        gpus=np.asarray(cols["gpu"], dtype=np.int64),
        models=tuple(models),
    )


def load_pods(path: str | Path) -> PodTable:
    """Read a pod list (any variant); every malformed row raises `TraceError` naming its line."""
    path = Path(path)
    cols: dict[str, list[int]] = {c: [] for c in ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli")}
    times: dict[str, list[int]] = {c: [] for c in ("creation_time", "deletion_time", "scheduled_time")}
    names: list[str] = []
    specs: list[str] = []
    qos: list[str] = []
    seen: dict[str, int] = {}
    has_times = True
    for line, row in _rows(path, POD_COLUMNS):
        name = _new_name(path, line, row["name"], "name", "pod", seen)
        for column in cols:
            cols[column].append(_int(path, line, row, column))
        _check_gpu(path, line, cols["num_gpu"][-1], cols["gpu_milli"][-1])
        spec = row.get("gpu_spec", "").strip()
        specs.append("" if spec.lower() == "nan" else spec)
        if spec and any(not part.strip() for part in spec.split("|")):
            raise TraceError(f"{path}:{line}: gpu_spec {spec!r} has an empty model name")
        qos.append(row.get("qos", "").strip() or "default")
        has_times = has_times and "creation_time" in row and "deletion_time" in row
        for column in times:
            times[column].append(_int(path, line, row, column, optional=True) if column in row else MISSING_TIME)
        names.append(name)
    if not names:
        raise TraceError(f"{path}: no pods")
    creation = np.asarray(times["creation_time"], dtype=np.int64)
    deletion = np.asarray(times["deletion_time"], dtype=np.int64)
    return PodTable(
        names=tuple(names),
        cpu_milli=np.asarray(cols["cpu_milli"], dtype=np.int64),
        memory_mib=np.asarray(cols["memory_mib"], dtype=np.int64),
        num_gpu=np.asarray(cols["num_gpu"], dtype=np.int64),
        gpu_milli=np.asarray(cols["gpu_milli"], dtype=np.int64),
        gpu_spec=tuple(specs),
        qos=tuple(qos),
        creation=creation,
        deletion=deletion,
        scheduled=np.asarray(times["scheduled_time"], dtype=np.int64),
        has_times=has_times and bool((creation >= 0).all()),
        source=str(path),
    )


def _check_gpu(path: Path, line: int, k: int, d: int) -> None:
    if k == 0 and d != 0:
        raise TraceError(f"{path}:{line}: gpu_milli is {d} but num_gpu is 0")
    if k > 0 and not 0 < d <= MILLI_PER_GPU:
        raise TraceError(f"{path}:{line}: gpu_milli must be in 1..{MILLI_PER_GPU} when num_gpu > 0, got {d}")
    if k > 1 and d != MILLI_PER_GPU:
        raise TraceError(f"{path}:{line}: a pod of {k} GPUs must take whole GPUs (gpu_milli 1000), got {d}")
    if d % 10:
        raise TraceError(f"{path}:{line}: gpu_milli must be a multiple of 10 (1 % of a GPU), got {d}")


def models_of(spec: str) -> tuple[str, ...]:
    """The allowed GPU models of a ``gpu_spec`` ("A|B|B" -> ("A", "B")); () means any."""
    return tuple(sorted({part.strip() for part in spec.split("|") if part.strip()}))


# Mapping onto finesched -----------------------------------------------------------------------------------
def partition_table(gpus: int) -> dict[str, list[dict[str, Any]]]:
    """A GPU partition table of aligned blocks, the shape of an NVLink fabric of pairs, quads and
    eights: for every power of two s <= gpus, the sets [k·s, (k+1)·s). E.g. 4 GPUs: {0..3}, {0,1},
    {2,3}, {0}..{3}."""
    out, size = {}, 1
    while size <= gpus:
        out[str(size)] = [
            {"minors": list(range(k, k + size)), "allocationScore": 1} for k in range(0, gpus - size + 1, size)
        ]
        size *= 2
    return out


def to_nodes(table: NodeTable, gpu_partitions: str | None = None) -> list[Node]:
    """One finesched Node per row: cpu, memory, GPUs as devices, the model as label ``gpu-model``;
    with `gpu_partitions` (Honor or Prefer) a partition table (`partition_table`) under that policy.

    Rows of equal specs (the default trace: 1,213 nodes, 15 specs) share one validated Node: the
    others are copies under their own name, which is checked as the Node would check it (a bad
    name is validated as a whole Node, so the error is the one a Node gives)."""
    nodes = []
    built: dict[tuple[int, int, int, str], Node] = {}
    for i, name in enumerate(table.names):
        spec = (int(table.cpu_milli[i]), int(table.memory_mib[i]), int(table.gpus[i]), table.models[i])
        template = built.get(spec)
        if template is not None and _valid_name(name):
            nodes.append(fast_copy(template, {"name": name}))
            continue
        memory = GPU_MEMORY_BY_MODEL.get(table.models[i], NOMINAL_GPU_MEMORY)
        data: dict[str, Any] = {
            "name": name,
            "labels": {GPU_MODEL_LABEL: table.models[i]} if table.models[i] else {},
            "allocatable": {
                "cpu": f"{int(table.cpu_milli[i])}m",
                "memory": f"{int(table.memory_mib[i])}Mi",
                "pods": str(MAX_PODS_PER_NODE),
            },
            "devices": [
                {
                    "type": "gpu",
                    "minor": g,
                    "resources": {"gpu-core": 100, "gpu-memory-ratio": 100, "gpu-memory": memory},
                }
                for g in range(int(table.gpus[i]))
            ],
        }
        if gpu_partitions and table.gpus[i]:
            data["gpuPartitions"] = partition_table(int(table.gpus[i]))
            data["policies"] = {"gpuPartitionPolicy": gpu_partitions}
        nodes.append(built.setdefault(spec, Node.model_validate(data)))
    return nodes


_NAME = TypeAdapter(ObjectName)


def _valid_name(name: str) -> bool:
    """Whether `name` passes the check of Node.name."""
    try:
        _NAME.validate_python(name)
    except PydanticValidationError:
        return False
    return True


def gpu_requests(k: int, d: int) -> dict[str, int]:
    """The device requests of a pod of k GPUs at d milli each (see the module docstring)."""
    if k == 0:
        return {}
    if k == 1 and d < MILLI_PER_GPU:
        return {"gpu-core": d // 10, "gpu-memory-ratio": d // 10}
    return {"nvidia.com/gpu": k}


class WorkloadFactory:
    """Builds the Workload of a trace pod; pods with equal specs share a validated template."""

    def __init__(self, namespace: str = "trace"):
        self.namespace = namespace
        self._templates: dict[tuple[int, int, int, int, str, str], Workload] = {}

    def make(self, table: PodTable, i: int, name: str | None = None) -> Workload:
        key = (
            int(table.cpu_milli[i]),
            int(table.memory_mib[i]),
            int(table.num_gpu[i]),
            int(table.gpu_milli[i]),
            table.gpu_spec[i],
            table.qos[i],
        )
        template = self._templates.get(key)
        if template is None:
            template = self._templates[key] = self._template(*key)
        return fast_copy(template, {"name": name or table.names[i]})  # = model_copy, a few µs less

    def _template(self, cpu: int, mem_mib: int, k: int, d: int, spec: str, qos: str) -> Workload:
        requests: dict[str, Any] = {"cpu": f"{cpu}m", "memory": f"{mem_mib}Mi", **gpu_requests(k, d)}
        models = models_of(spec) if k > 0 else ()
        affinity = [{"key": GPU_MODEL_LABEL, "operator": "In", "values": list(models)}] if models else []
        return Workload.model_validate(
            {
                "name": "template",
                "namespace": self.namespace,
                "tenant": qos,
                "labels": {"trace-qos": qos},
                "requests": {k_: v for k_, v in requests.items() if v != "0m" and v != "0Mi"},
                "nodeAffinity": affinity,
            }
        )
