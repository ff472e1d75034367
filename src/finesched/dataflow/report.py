"""Plain-data views of a compiled job and of its placed slots (for `-o json` and API answers).

Keys are the public Python API's names (`regions`, `groups`, `slot_requests`, `slots_needed`,
`fractions`, ...), so a script reads the same thing from the CLI as from `compile_job`; subtasks
are written ``task#index``. A slot
record has the shape the server answers `POST /v1/jobs` with:
``{"workload", "group", "binding": {"node", "cpuset", "devices", "numa"} | null, "quotas"}``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from finesched.dataflow.compile import CompiledJob
from finesched.dataflow.gang import GROUP_LABEL, QUOTAS_ANNOTATION
from finesched.model.binding import Binding
from finesched.model.workload import Workload


def _ordered(tasks: frozenset[str], compiled: CompiledJob) -> list[str]:
    return [t for t in compiled.graph.task_ids if t in tasks]


def compiled_record(compiled: CompiledJob) -> dict[str, Any]:
    """Everything `compile_job` decided, as JSON-ready data (tasks in manifest order)."""
    job = compiled.job
    position = {task: k for k, task in enumerate(compiled.graph.task_ids)}
    return {
        "job": f"{job.namespace}/{job.name}",
        "mode": job.mode,
        "all_sources_in_same_region": compiled.all_sources_in_same_region,
        "weighted_fractions": compiled.weighted_fractions,
        "specified": compiled.specified,
        "regions": [_ordered(region, compiled) for region in compiled.regions],
        "subtask_regions": [
            [f"{task}#{i}" for task, i in sorted(region, key=lambda s: (position[s[0]], s[1]))]
            for region in compiled.subtask_regions()
        ],
        "groups": {name: _ordered(tasks, compiled) for name, tasks in compiled.groups.items()},
        "group_slots": dict(compiled.group_slots),
        "slot_requests": compiled.slot_requests,
        "slots_needed": compiled.slots_needed,
        "component_slots": compiled.component_slots,
        "network": dict(compiled.network),
        "fractions": {op: list(pair) for op, pair in compiled.fractions.items()},
        "trim_partial_pipelines": compiled.trim_partial_pipelines,
        "slots": [
            {
                "group": group,
                "index": index,
                "tasks": compiled.slot_tasks(group, index),
                "request": compiled.slot_profile(group, index).as_dict(),
                "quotas": compiled.slot_quotas(group, index),
            }
            for group, count in compiled.group_slots.items()
            for index in range(count)
        ],
        "warnings": list(compiled.warnings),
        "quotas": {op: q for group in compiled.groups for op, q in compiled.group_quotas(group).items()},
    }


def binding_record(binding: Binding) -> dict[str, Any]:
    """Where a slot landed: node, cpuset (cpulist text, "" when shared), device grants, NUMA nodes."""
    return {
        "node": binding.node,
        "cpuset": str(binding.cpuset),
        "devices": binding.devices_doc(),
        "numa": [g.numa for g in binding.numa],
    }


def slot_records(workloads: Sequence[Workload], bindings: Sequence[Binding] | None) -> list[dict[str, Any]]:
    """One record per slot; `bindings` None (or missing a slot) means the slot is not placed."""
    placed = {b.workload: b for b in bindings or ()}
    out = []
    for w in workloads:
        binding = placed.get(w.key)
        text = binding.annotations.get(QUOTAS_ANNOTATION) if binding is not None else None
        quotas = json.loads(text or w.annotations.get(QUOTAS_ANNOTATION, "{}"))
        out.append(
            {
                "workload": w.key,
                "group": w.labels.get(GROUP_LABEL, ""),
                "binding": binding_record(binding) if binding is not None else None,
                "quotas": quotas,
            }
        )
    return out
