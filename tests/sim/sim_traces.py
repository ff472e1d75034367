"""Tiny hand-made traces for the simulator tests (the real trace is too big for unit tests).

A module of its own, not conftest.py, so `from sim_traces import ...` names one file whatever
other test directories a pytest run collects (several of them have a conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
)

#: 30 nodes, 120 GPUs: 12 x (16 CPU, 4 GPUs, model A), 9 x (32 CPU, 8 GPUs, B), 9 x (8 CPU, no GPU).
NODES = [
    *(f"n-a{i:02d},16000,65536,4,A" for i in range(12)),
    *(f"n-b{i:02d},32000,131072,8,B" for i in range(9)),
    *(f"n-c{i:02d},8000,32768,0," for i in range(9)),
]

#: Pod shapes (cpu, memory MiB, k, d, spec) the generator draws from.
SHAPES = [
    (2000, 4096, 1, 500, ""),
    (4000, 8192, 1, 1000, ""),
    (1000, 2048, 1, 250, "A"),
    (3000, 4096, 1, 810, ""),
    (6000, 8192, 2, 1000, "B"),
    (2000, 2048, 0, 0, ""),
    (4000, 4096, 1, 470, "A|B"),
]


def pod_rows(count: int, seed: int = 7) -> list[str]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(count):
        cpu, mem, k, d, spec = SHAPES[int(rng.integers(len(SHAPES)))]
        qos = ("LS", "BE")[i % 2]
        start = int(rng.integers(0, 2000))
        rows.append(
            f"pod-{i:04d},{cpu},{mem},{k},{d},{spec},{qos},Running,{start},{start + int(rng.integers(50, 600))},{start}"
        )
    return rows


def write(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path
