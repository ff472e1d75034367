"""What each slot of a job runs: its command, with the slot's place in the job in its environment.

A slot sharing group may name one command for all its slots (``spec.slotSharingGroups.<group>``);
otherwise every task of the group names its own (``spec.tasks[i].command``) and a slot runs the
command of each task it holds, side by side (as a Flink TaskManager slot runs one subtask of each
task in it). A job whose slot would run nothing cannot be submitted (`command_problems`).

Every command gets these variables (besides its own `env` and what the node agent sets):

    FINESCHED_JOB, FINESCHED_JOB_NAMESPACE    the job
    FINESCHED_SLOT_SHARING_GROUP              the slot's group
    FINESCHED_SUBTASK_INDEX                   the slot's index = the subtask index of every task in it
    FINESCHED_TASKS                           the tasks the slot holds (comma-separated)
    FINESCHED_TASK_PARALLELISM                task=parallelism for each of them (comma-separated)
    FINESCHED_MANAGED_MEMORY_QUOTAS           operator -> managed-memory quota in bytes (JSON)
    FINESCHED_TASK, FINESCHED_PARALLELISM     a task's command: its task and parallelism;
                                              a group's command: FINESCHED_PARALLELISM = the group's slots
    FINESCHED_MANAGED_MEMORY                  bytes: the task's operators' quotas (a task's command)
                                              or the whole slot's (a group's command)

The slot's workload runs ``/bin/sh -c SCRIPT``: the script exports the variables and `exec`s the
one command, or, for several tasks, starts each in the background and waits; when one fails the
others are stopped and the slot exits with the failed task's code (so its region is restarted).
Only /bin/sh is needed on the node.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence

from finesched.dataflow.compile import CompiledJob
from finesched.errors import ErrorDetail
from finesched.model.job import Job

#: argv[0] of the slot script (what `ps` shows for it).
SCRIPT_NAME = "finesched-slot"
#: Polling period of the several-task script: how soon a failed task stops its slot's other tasks.
POLL = "0.2"


def command_problems(job: Job, compiled: CompiledJob) -> list[ErrorDetail]:
    """Every reason a slot of `job` would have nothing to run, or an ambiguous command; empty when
    every slot has exactly one source of commands."""
    problems: list[ErrorDetail] = []
    groups = compiled.tasks_by_group
    for name, run in job.slot_sharing_groups.items():
        path = f"spec.slotSharingGroups.{name}"
        if name not in groups:
            known = ", ".join(groups)
            problems.append(ErrorDetail(path, f"no task is in slot sharing group {name!r} (groups: {known})", name))
        elif not run.command:
            problems.append(ErrorDetail(f"{path}.command", "is required (what every slot of the group runs)"))
    index = {task.id: i for i, task in enumerate(job.tasks)}
    for group, tasks in groups.items():
        shared = job.slot_sharing_groups.get(group)
        for task_id in tasks:
            task = job.tasks[index[task_id]]
            path = f"spec.tasks[{index[task_id]}].command"
            if shared is not None and task.command:
                rule = (f"task {task_id} is in slot sharing group {group}, which has its own command "
                        f"(spec.slotSharingGroups.{group}.command): give one or the other")  # fmt: skip
                problems.append(ErrorDetail(path, rule))
            elif shared is None and not task.command:
                rule = (f"task {task_id} has no command and its slot sharing group {group} has none "
                        f"(spec.slotSharingGroups.{group}.command): every slot must say what it runs")  # fmt: skip
                problems.append(ErrorDetail(path, rule))
    return problems


def slot_env(job: Job, compiled: CompiledJob, group: str, index: int) -> dict[str, str]:
    """The variables every command of slot `index` of `group` gets (module docstring)."""
    tasks = compiled.slot_tasks(group, index)
    quotas = compiled.slot_quotas(group, index)
    parallelism = {t: compiled.graph.task(t).parallelism for t in tasks}
    return {
        "FINESCHED_JOB": job.name,
        "FINESCHED_JOB_NAMESPACE": job.namespace,
        "FINESCHED_SLOT_SHARING_GROUP": group,
        "FINESCHED_SUBTASK_INDEX": str(index),
        "FINESCHED_TASKS": ",".join(tasks),
        "FINESCHED_TASK_PARALLELISM": ",".join(f"{t}={p}" for t, p in parallelism.items()),
        "FINESCHED_MANAGED_MEMORY_QUOTAS": json.dumps(quotas, separators=(",", ":")),
    }


def slot_command(job: Job, compiled: CompiledJob, group: str, index: int) -> tuple[str, ...]:
    """The argv of slot `index` of `group` (``/bin/sh -c SCRIPT finesched-slot``), or () when the
    job does not say what it runs (`command_problems` explains why)."""
    if command_problems(job, compiled):
        return ()
    common = slot_env(job, compiled, group, index)
    quotas = compiled.slot_quotas(group, index)
    shared = job.slot_sharing_groups.get(group)
    if shared is not None:
        env = {**shared.env, **common, "FINESCHED_PARALLELISM": str(compiled.group_slots[group]),
               "FINESCHED_MANAGED_MEMORY": str(sum(quotas.values()))}  # fmt: skip
        return _script([_exec_line(env, [*shared.command, *shared.args])])
    tasks = {task.id: task for task in job.tasks}
    runs = []
    for task_id in compiled.slot_tasks(group, index):
        task = tasks[task_id]
        operators = {op.id for op in task.operators}
        own = {
            "FINESCHED_TASK": task_id,
            "FINESCHED_PARALLELISM": str(task.parallelism),
            "FINESCHED_MANAGED_MEMORY": str(sum(q for op, q in quotas.items() if op in operators)),
        }
        runs.append((task_id, {**task.env, **common, **own}, [*task.command, *task.args]))
    if len(runs) == 1:
        _, env, argv = runs[0]
        return _script([_exec_line(env, argv)])
    return _script(_side_by_side(runs))


def _script(lines: Sequence[str]) -> tuple[str, ...]:
    return ("/bin/sh", "-c", "\n".join(lines), SCRIPT_NAME)


def _assignments(env: Mapping[str, str]) -> str:
    return " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())


def _exec_line(env: Mapping[str, str], argv: Sequence[str]) -> str:
    return f"export {_assignments(env)}\nexec {shlex.join(argv)}"


def _side_by_side(runs: Sequence[tuple[str, Mapping[str, str], Sequence[str]]]) -> list[str]:
    """Start every task in the background; each records its end (and a failure) in a scratch
    directory, which the script polls. On the first failure it stops every other process of the
    slot: the slot's process group (which the node agent also stops the slot by) but for itself and
    its parent, read from /proc so a task's own children stop too. It then exits with the failed
    task's code; 0 when all succeed."""
    lines = ["d=$(mktemp -d) || exit 70", ': > "$d/done"; : > "$d/failed"']
    for task_id, env, argv in runs:
        lines.append(
            f"( {_assignments(env)} {shlex.join(argv)}; rc=$?; "
            f'if [ "$rc" -ne 0 ]; then echo {shlex.quote(task_id)} "$rc" >> "$d/failed"; fi; '
            f'echo . >> "$d/done"; exit "$rc" ) &'
        )
    lines += [
        f'while [ ! -s "$d/failed" ] && [ "$(wc -l < "$d/done")" -lt {len(runs)} ]; do sleep {POLL}; done',
        "stop_others() {",
        '  read -r s < "/proc/$$/stat"; s=${s##*) }; set -- $s; g=$3',
        "  for f in /proc/[0-9]*/stat; do",
        '    read -r s 2>/dev/null < "$f" || continue',
        "    s=${s##*) }; set -- $s; p=${f#/proc/}; p=${p%/stat}",
        '    if [ "$3" = "$g" ] && [ "$p" != "$$" ] && [ "$p" != "$PPID" ]; then kill -TERM "$p" 2>/dev/null; fi',
        "  done",
        "}",
        f'if [ -s "$d/failed" ]; then stop_others; sleep {POLL}; stop_others; fi',
        "wait",
        "code=0",
        'if [ -s "$d/failed" ]; then read -r task code < "$d/failed"; '
        'echo "finesched: task $task exited with code $code; the slot\'s other tasks were stopped" >&2; fi',
        'rm -rf "$d"',
        'exit "$code"',
    ]
    return lines
