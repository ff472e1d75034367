"""Dataflow jobs (seed S2, Flink FLIP-53): operator resources -> pipelined regions -> slot sharing
groups -> slot requests and managed-memory fractions, gang-scheduled by the scheduler core.

    from finesched.dataflow import compile_job, gang_workloads
    compiled = compile_job(job)                 # job: a parsed Job manifest
    compiled.regions, compiled.groups, compiled.slot_requests, compiled.slots_needed, compiled.fractions
    compiled.quotas(1100 * 2**20)               # operator -> managed-memory quota (bytes) in such a slot
    scheduler.schedule_gang(gang_workloads(job, compiled))   # all slots or none
"""

from finesched.dataflow.compile import CompiledJob, CompileError, compile_job
from finesched.dataflow.gang import QUOTAS_ANNOTATION, binding_quotas, gang_workloads, place_gang, slot_requests
from finesched.dataflow.graph import Edge, JobGraph, Operator, ResourceSpec, Task
from finesched.dataflow.network import NetworkConfig

__all__ = [
    "QUOTAS_ANNOTATION",
    "CompileError",
    "CompiledJob",
    "Edge",
    "JobGraph",
    "NetworkConfig",
    "Operator",
    "ResourceSpec",
    "Task",
    "binding_quotas",
    "compile_job",
    "gang_workloads",
    "place_gang",
    "slot_requests",
]
