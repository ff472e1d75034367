"""A compiled job as a gang of slot workloads, placed all-or-nothing by the scheduler core (S2.3).

Every slot sharing group needs as many slots as its largest parallelism; each slot becomes one
workload that requests the group's slot profile (or, with `trimPartialPipelines`, its own tasks'
profile) in finesched resources:

    cpu    = the profile's cpu (millicores)
    memory = task heap + task off-heap + managed on-heap + managed off-heap + network (bytes)
    gpu N  = gpu-core 100·N + gpu-memory-ratio 100·N (N whole GPUs, Koordinator's translation)
    extended resources as written (rdma, gpu-core/gpu-memory-ratio shares, counts)

and carries its operators' absolute managed-memory quotas as the annotation
``finesched.io/managed-memory-quotas`` (JSON ``{operator: bytes}``), which the scheduler copies
onto the slot's binding for the node agent. All slots form one gang (the job's name, min member =
every slot, the job's `topology`): `Scheduler.schedule_gang` reserves all of them or none. A
slot's command is the one `finesched.dataflow.commands` builds (none when the job names none),
and its labels say its job, group, index and failover region (`finesched.dataflow.failover`).
"""

from __future__ import annotations

import json

from finesched.dataflow.commands import slot_command
from finesched.dataflow.compile import CompiledJob, CompileError
from finesched.dataflow.failover import failover_regions
from finesched.dataflow.graph import ResourceSpec
from finesched.errors import ErrorDetail
from finesched.model.binding import Binding
from finesched.model.job import Job
from finesched.model.resources import CPU, GPU_CORE, GPU_MEMORY_RATIO, MEMORY, ResourceVector
from finesched.model.workload import Gang, Workload
from finesched.sched.scheduler import CARRIED_ANNOTATIONS, Scheduler

#: The binding annotation with a slot's per-operator managed-memory quotas (bytes). A slot's group
#: is both a label (for selection) and an annotation (for drivers reading annotations only).
QUOTAS_ANNOTATION = "finesched.io/managed-memory-quotas"
if QUOTAS_ANNOTATION not in CARRIED_ANNOTATIONS:  # the scheduler must copy it onto bindings
    raise ImportError(f"finesched.sched.scheduler.CARRIED_ANNOTATIONS lacks {QUOTAS_ANNOTATION}")
JOB_LABEL = "finesched.io/job"
GROUP_LABEL = "finesched.io/slot-sharing-group"
SLOT_LABEL = "finesched.io/slot-index"
REGION_LABEL = "finesched.io/failover-region"


def slot_requests(profile: ResourceSpec) -> ResourceVector:
    """The finesched requests of one slot of `profile` (module docstring); zero amounts left out."""
    amounts: dict[str, int] = {CPU: profile.cpu, MEMORY: profile.memory}
    if profile.gpu:
        amounts[GPU_CORE] = amounts.get(GPU_CORE, 0) + 100 * profile.gpu
        amounts[GPU_MEMORY_RATIO] = amounts.get(GPU_MEMORY_RATIO, 0) + 100 * profile.gpu
    for name, amount in profile.extended:
        amounts[name] = amounts.get(name, 0) + amount
    return ResourceVector({k: v for k, v in amounts.items() if v})


def slot_name(job: Job, group: str, index: int) -> str:
    return f"{job.name}-{group}-{index}"


def topology_problems(job: Job, compiled: CompiledJob) -> list[ErrorDetail]:
    """Why the job's `topology` cannot cut its slots into slices: the slice size must divide the
    number of slots (the gang's members), as a gang's must divide its minMember."""
    sliced = job.topology.slice if job.topology is not None else None
    if sliced is None or compiled.slots_needed % sliced.size == 0:
        return []
    rule = f"must divide the job's slot count ({compiled.slots_needed}): its slots are cut into whole slices"
    return [ErrorDetail("spec.topology.slice.size", rule, sliced.size)]


def gang_workloads(job: Job, compiled: CompiledJob) -> list[Workload]:
    """One workload per slot of `compiled` (`compile_job(job)`), all in one gang, group by group; the
    job's `topology` is the gang's (CompileError when its slice size does not divide the slots)."""
    problems = topology_problems(job, compiled)
    if problems:
        raise CompileError(problems)
    total = compiled.slots_needed
    region_of = {slot: k for k, region in enumerate(failover_regions(compiled)) for slot in region}
    out: list[Workload] = []
    for group, slots in compiled.group_slots.items():
        for index in range(slots):
            requests = slot_requests(compiled.slot_profile(group, index))
            quotas = json.dumps(compiled.slot_quotas(group, index), separators=(",", ":"))  # manifest order
            labels = {**job.labels, JOB_LABEL: job.name, GROUP_LABEL: group, SLOT_LABEL: str(index),
                      REGION_LABEL: str(region_of[(group, index)])}  # fmt: skip
            out.append(
                Workload(
                    name=slot_name(job, group, index),
                    namespace=job.namespace,
                    labels=labels,
                    annotations={QUOTAS_ANNOTATION: quotas, GROUP_LABEL: group},
                    requests=requests,
                    gang=Gang(name=job.name, min_member=total, topology=job.topology),
                    command=slot_command(job, compiled, group, index),
                    priority_class_name=job.priority_class_name,
                )
            )
    return out


def place_gang(scheduler: Scheduler, job: Job, compiled: CompiledJob) -> list[Binding]:
    """Place every slot of the job or none (raises the scheduler's FitError, nothing left reserved)."""
    return scheduler.schedule_gang(gang_workloads(job, compiled))


def binding_quotas(binding: Binding) -> dict[str, int]:
    """The per-operator quotas a slot's binding carries (empty when it carries none)."""
    text = binding.annotations.get(QUOTAS_ANNOTATION)
    return {str(k): int(v) for k, v in json.loads(text).items()} if text else {}
