"""Fixtures of the simulator tests over the tiny traces of sim_traces.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from sim_traces import NODE_HEADER, NODES, POD_HEADER, pod_rows, write


@pytest.fixture
def tiny_trace(tmp_path: Path) -> tuple[Path, Path]:
    """(nodes.csv, pods.csv): 30 nodes / 120 GPUs and 150 pods asking about 97 % of the GPUs."""
    return write(tmp_path / "nodes.csv", NODE_HEADER, NODES), write(tmp_path / "pods.csv", POD_HEADER, pod_rows(150))
