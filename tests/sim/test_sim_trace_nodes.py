"""`to_nodes` builds one Node per spec and copies it under each row's name: every node is the one a
validation of its row gives, and a bad name is refused as Node refuses it."""

from __future__ import annotations

import numpy as np
import pydantic
import pytest

from finesched.model.node import Node
from finesched.sim.trace import NodeTable, to_nodes


def table(names: tuple[str, ...], models: tuple[str, ...] | None = None) -> NodeTable:
    n = len(names)
    return NodeTable(
        names=names,
        cpu_milli=np.array([64000, 64000, 96000, 64000, 64000][:n], dtype=np.int64),
        memory_mib=np.full(n, 262144, dtype=np.int64),
        gpus=np.array([8, 8, 2, 8, 0][:n], dtype=np.int64),
        models=models or ("V100M32", "V100M32", "T4", "V100M32", "")[:n],
    )


@pytest.mark.parametrize("partitions", [None, "Honor", "Prefer"])
def test_copies_equal_a_validation_of_their_row(partitions: str | None) -> None:
    rows = table(("a", "b", "c", "d", "e"))
    nodes = to_nodes(rows, partitions)
    for node in nodes:
        again = Node.model_validate(node.model_dump(by_alias=True, exclude_unset=True))
        assert node == again and node.model_dump() == again.model_dump()
    assert [n.name for n in nodes] == ["a", "b", "c", "d", "e"]
    assert nodes[0].devices == nodes[1].devices and nodes[0].name != nodes[1].name


def test_a_bad_name_on_a_copied_row_is_refused_as_node_refuses_it() -> None:
    rows = table(("a", "Not_A_Name"))
    with pytest.raises(pydantic.ValidationError) as copied:
        to_nodes(rows)
    with pytest.raises(pydantic.ValidationError) as direct:
        to_nodes(table(("Not_A_Name",)))
    assert str(copied.value) == str(direct.value)
    assert copied.value.errors()[0]["loc"] == ("name",)
