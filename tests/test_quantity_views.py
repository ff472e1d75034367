"""Amounts for people: one formatter (`human_quantity`), the same text in every view.

The table (tests/quantity_table.py) is the contract the console's formatter is held to as well;
here the Python side, its properties, and the CLI views of one amount at 80 columns."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from finesched.model.resources import human_amount, human_amounts
from finesched.quantity import MAX_QUANTITY, human_quantity, parse_quantity
from quantity_table import CASES, NAMED


@pytest.mark.parametrize(("value", "kind", "text"), CASES)
def test_the_table(value: int, kind: str, text: str) -> None:
    assert human_quantity(value, kind) == text


@pytest.mark.parametrize(("name", "value", "text"), NAMED)
def test_the_table_by_resource_name(name: str, value: int | str, text: str) -> None:
    assert human_amount(name, value) == text


@given(st.integers(0, MAX_QUANTITY))
def test_a_whole_number_is_exact_and_a_decimal_is_within_half_a_tenth(value: int) -> None:
    text = human_quantity(value, "bytes")
    if "." not in text:
        assert parse_quantity(text, "bytes") == value
    else:
        number, suffix = text[:-2], text[-2:]
        scale = 1 << (10 * ("KMGTPE".index(suffix[0]) + 1))
        assert abs(value * 10 - round(float(number) * 10) * scale) * 2 <= scale  # |value - shown| <= 0.05 unit
        assert float(number) < 1024 or suffix == "Ei"
        assert float(number) >= 1


@given(st.integers(0, MAX_QUANTITY))
def test_cpu_reads_back_exactly(value: int) -> None:
    assert parse_quantity(human_quantity(value, "cpu"), "cpu") == value


def test_bad_input_is_refused() -> None:
    with pytest.raises(TypeError):
        human_quantity(1.5, "bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown quantity kind"):
        human_quantity(1, "liters")


def test_every_cli_view_of_one_plan_prints_the_same_amounts(tmp_path) -> None:
    """`validate`, `plan` (table, NUMA zones) of one workload of 10307921510 bytes: 9.6Gi in each,
    while -o json keeps the exact integer text."""
    doc = tmp_path / "cluster.yaml"
    doc.write_text(
        """apiVersion: finesched.io/v1alpha1
kind: Node
metadata: {name: n1}
spec:
  cpuTopology: {sockets: 1, numaPerSocket: 2, coresPerNuma: 2, threadsPerCore: 2}
  numaZones: [{id: 0, memory: 8Gi}, {id: 1, memory: 8Gi}]
---
apiVersion: finesched.io/v1alpha1
kind: Workload
metadata: {name: ls, namespace: team-a}
spec: {requests: {cpu: 1500m, memory: "10307921510"}}
"""
    )
    env = {"COLUMNS": "80", "PATH": "/usr/bin:/bin"}
    cli = [sys.executable, "-m", "finesched.cli"]

    def run(*args: str) -> str:
        done = subprocess.run([*cli, *args], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        assert max(map(len, done.stdout.splitlines())) <= 80, done.stdout
        return done.stdout

    assert "asks cpu=1500m, memory=9.6Gi" in run("validate", str(doc))
    nodes = run("plan", str(doc), "--show-nodes")
    shared = next(line for line in nodes.splitlines() if "shared" in line and "used" in line)
    assert "1500m used" in shared and "9.6Gi used" in shared  # held by the LS workload, in no zone
    assert "8Gi/8Gi" in nodes
    assert "10307921510" not in nodes
    assert '"10307921510"' in run("plan", str(doc), "--show-nodes", "-o", "json")


def test_human_amounts_joins_in_order() -> None:
    assert human_amounts({"cpu": 500, "memory": 10307921510}) == "cpu=500m, memory=9.6Gi"
    assert human_amounts({}) == ""
