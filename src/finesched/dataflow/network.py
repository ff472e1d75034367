"""Network memory of one subtask, derived from its input and output channels (seed S2.3).

Operators never declare network memory (the seed: it "can be derived from the execution
topology at runtime"); a slot request adds, for each task of its group, what one subtask needs:

    network(task) = buffer_size x (
        Σ over input edges (gates):     channels x buffers_per_channel + floating_buffers_per_gate
      + Σ over pipelined output edges:  subpartitions x buffers_per_channel + floating_buffers_per_gate
      + Σ over blocking output edges:   subpartitions + 1 )

A blocking result is written out and read later, so it needs one buffer per subpartition plus
one, not credit for a live reader. Channels per subtask, for an edge from p producers to q consumers:

    all-to-all:  each consumer has p input channels, each producer q subpartitions;
    pointwise:   each consumer has ceil(p / q) input channels, each producer ceil(q / p) subpartitions
                 (1 and 1 when p == q: subtask i feeds subtask i).

Worked example (defaults: 32 KiB buffers, 2 per channel, 8 floating per gate): a task with
parallelism 4 reading an all-to-all edge from a task with parallelism 2 and writing a pipelined
pointwise edge to a task with parallelism 4:
input 2 x 2 + 8 = 12, output 1 x 2 + 8 = 10 -> 22 buffers x 32 KiB = 704 KiB.
"""

from __future__ import annotations

from dataclasses import dataclass

from finesched.dataflow.graph import Edge, JobGraph
from finesched.model.job import NetworkMemory


@dataclass(frozen=True, slots=True)
class NetworkConfig:
    """The formula's parameters (manifest `spec.network`, or `compile_job(network=...)`)."""

    buffer_size: int = 32 * 1024
    buffers_per_channel: int = 2
    floating_buffers_per_gate: int = 8

    @classmethod
    def of(cls, network: NetworkMemory) -> NetworkConfig:
        return cls(network.buffer_size, network.buffers_per_channel, network.floating_buffers_per_gate)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def channels(edge: Edge, producers: int, consumers: int) -> tuple[int, int]:
    """(input channels of one consumer subtask, subpartitions of one producer subtask) on `edge`."""
    if edge.pattern == "all-to-all":
        return producers, consumers
    return _ceil_div(producers, consumers), _ceil_div(consumers, producers)


def task_network_bytes(graph: JobGraph, task_id: str, config: NetworkConfig) -> int:
    """Network memory one subtask of `task_id` needs (the module docstring's formula)."""
    buffers = 0
    for edge in graph.inputs[task_id]:
        inputs, _ = channels(edge, graph.task(edge.source).parallelism, graph.task(task_id).parallelism)
        buffers += inputs * config.buffers_per_channel + config.floating_buffers_per_gate
    for edge in graph.outputs[task_id]:
        _, subpartitions = channels(edge, graph.task(task_id).parallelism, graph.task(edge.target).parallelism)
        if edge.type == "blocking":
            buffers += subpartitions + 1
        else:
            buffers += subpartitions * config.buffers_per_channel + config.floating_buffers_per_gate
    return buffers * config.buffer_size
