"""The Deploy Executor (S0.6): turns this node's bindings into pinned processes and reports their ends.

Each `sync` compares the server's bindings for this node with the processes the agent runs:

1. A process whose binding is gone (workload deleted, released) or replaced by another placement
   (other CPUs or devices, or a fresh unacked binding where the agent had acked one) is stopped
   and forgotten.
2. A new binding is verified (right node, a command, CPUs online and not held by another exclusive
   binding, devices present and healthy); a failure is rejected with the reasons, so the server
   releases it and requeues the workload. A good one is launched, recorded, acked, and reported
   Running with what took effect (affinity, cgroup files). MIG instances are resolved first
   (mig.py): an existing instance's UUID, or on a dynamic card one created through NVML, which
   is destroyed again when its workload ends or its binding goes.
3. An acked binding the agent has no record of (its state was lost, or it was bound while the
   agent was replaced) is rejected with a reason, never silently kept.

`poll` notices ended processes (exit code 0 -> Succeeded, else Failed); `report` sends every
status the server has not accepted yet, so a status survives network errors and agent restarts.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from finesched.agent.binding import AgentBinding, MIGUse
from finesched.agent.cgroup import CgroupSupport, Group
from finesched.agent.discover import Discovery
from finesched.agent.launch import LaunchError, is_running, launch, read_exit_code, stop
from finesched.agent.mig import MIGControl, MIGError
from finesched.agent.state import AgentState, Record
from finesched.cpuset import CPUSet

log = logging.getLogger("finesched.agent")

#: Longest reason the control plane accepts in a reject or status.
MAX_REASON = 4096
UNKNOWN_AFTER_RESTART = "the agent has no process for this acked binding (agent state lost or replaced); released"


class ServerError(Exception):
    """A refused call; `status` is the HTTP status (0 when the server could not be reached)."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(f"{status}: {message}" if status else message)


class ServerPort(Protocol):
    """What the executor needs from the control plane (client.py implements it over HTTP)."""

    def ack(self, workload: str) -> None: ...
    def reject(self, workload: str, reason: str) -> None: ...
    def status(self, workload: str, phase: str, reason: str, exit_code: int | None, info: dict[str, Any]) -> None: ...


def workdir_of(data: Path, workload: str) -> Path:
    """Where a workload's log and exit file live: ``<data>/workloads/<namespace>/<name>``."""
    namespace, _, name = workload.partition("/")
    return data / "workloads" / namespace / name


class Executor:
    def __init__(
        self,
        data: Path,
        server: ServerPort,
        cgroups: CgroupSupport,
        base_env: Mapping[str, str] | None = None,
        stop_grace: float = 5.0,
        mig: MIGControl | None = None,
    ):
        self.data = data
        self.server = server
        self.cgroups = cgroups
        self.base_env = base_env
        self.stop_grace = stop_grace
        self.mig = mig
        self.state = AgentState.load(data / "agent-state.json")
        self.procs: dict[str, Any] = {}  # workload -> Popen, for children of this incarnation
        #: The CPUs this agent may use (a confined agent cannot pin a child outside them).
        self.allowed = CPUSet(os.sched_getaffinity(0))

    # Start-up ----------------------------------------------------------------------------------
    def adopt(self) -> dict[str, str]:
        """Re-adopt recorded processes that still run; record how the others ended. workload -> what."""
        outcome: dict[str, str] = {}
        for key, rec in self.state.records.items():
            if rec.phase != "Running":
                outcome[key] = f"{rec.phase} (status pending)"
            elif is_running(rec.pid, rec.start_time):
                outcome[key] = f"adopted pid {rec.pid}"
            else:
                self._ended(rec, read_exit_code(Path(rec.exit_file)), "ended while the agent was down")
                outcome[key] = f"{rec.phase} while the agent was down"
        self.state.save()
        return outcome

    # Bindings ----------------------------------------------------------------------------------
    def sync(self, bindings: list[AgentBinding], discovery: Discovery) -> None:
        current = {b.workload: b for b in bindings}
        for key, rec in list(self.state.records.items()):
            b = current.get(key)
            if b is None:
                self._forget(rec, "binding gone")
            elif b.placement != rec.placement or (rec.acked and not b.acked):
                self._forget(rec, "binding replaced by a new placement")
        for b in bindings:
            rec = self.state.records.get(b.workload)
            if rec is not None:
                if not rec.acked:
                    self._ack(rec)
                continue
            if b.acked:
                self._reject(b, UNKNOWN_AFTER_RESTART)
                continue
            reasons = self.verify(b, discovery)
            if reasons:
                self._reject(b, "; ".join(reasons))
                continue
            self._start(b, discovery)

    def verify(self, b: AgentBinding, discovery: Discovery) -> list[str]:
        """Every reason this node cannot run `b` now; empty when it can."""
        reasons: list[str] = []
        if b.node != discovery.node.name:
            reasons.append(f"binding is for node {b.node!r}, this agent runs node {discovery.node.name!r}")
        if not b.command:
            reasons.append("the workload has no command")
        offline = b.cpuset - discovery.online
        if offline:
            reasons.append(f"CPUs {offline} are not online here (online: {discovery.online})")
        outside = (b.cpuset & discovery.online) - self.allowed
        if outside:
            reasons.append(f"CPUs {outside} are outside the agent's own CPU affinity {self.allowed}")
        for kind, grants in b.devices.items():
            for minor, _ in grants:
                healthy = discovery.healthy(kind, minor)
                if healthy is None:
                    reasons.append(f"{kind} {minor} does not exist on this node")
                elif not healthy:
                    reasons.append(f"{kind} {minor} is unhealthy")
        for other in self._running():
            overlap = b.cpuset & CPUSet(other.cpuset)
            if overlap and (b.exclusive or other.exclusive):
                reasons.append(f"CPUs {overlap} are held by {other.workload} (exclusive cpuset)")
        return reasons

    def shared_pool(self, online: CPUSet) -> CPUSet:
        """Online CPUs no running exclusive binding holds: where a binding without a cpuset runs."""
        held = CPUSet()
        for rec in self._running():
            if rec.exclusive:
                held |= CPUSet(rec.cpuset)
        return (online - held) or online

    def _mig_instances(self, b: AgentBinding, discovery: Discovery) -> tuple[AgentBinding, list[list[int]]]:
        """`b` with every MIG instance's UUID, and [minor, GPU instance id] of those created here."""
        resolved, created = [], []
        cards = {d.minor: d.mig for d in discovery.node.devices if d.type == "gpu" and d.mig is not None}
        try:
            for use in b.mig:
                spec = cards.get(use.minor)
                if spec is None:
                    raise MIGError(f"gpu {use.minor} is not in MIG mode here")
                here = next((i.uuid for i in spec.instances if (i.profile, i.start) == (use.profile, use.start)), None)
                uuid = use.uuid or here
                if uuid is None and spec.mode == "dynamic" and self.mig is not None:
                    uuid, gi = self.mig.prepare(use.minor, use.profile, use.start)
                    if gi is not None:
                        created.append([use.minor, gi])
                if uuid is None:
                    raise MIGError(f"gpu {use.minor} has no {use.profile} instance at start {use.start}")
                resolved.append(MIGUse(use.minor, use.profile, use.start, uuid))
        except MIGError:
            self._destroy(created)
            raise
        return replace(b, mig=tuple(resolved)), created

    def _destroy(self, created: list[list[int]]) -> None:
        for minor, gi in created:
            problem = self.mig.destroy(minor, gi) if self.mig is not None else "NVML unavailable"
            if problem:
                log.warning("MIG instance not destroyed: %s", problem)

    def _start(self, b: AgentBinding, discovery: Discovery) -> None:
        cpus = b.cpuset or self.shared_pool(discovery.online)
        created: list[list[int]] = []
        try:
            if b.mig:
                b, created = self._mig_instances(b, discovery)
            done = launch(b, discovery.node, cpus, workdir_of(self.data, b.workload), self.cgroups, self.base_env)
        except (LaunchError, MIGError) as exc:
            self._destroy(created)
            self._reject(b, str(exc))
            return
        if b.mig:
            done.info["mig"] = [
                {"minor": u.minor, "profile": u.profile, "start": u.start, "uuid": u.uuid} for u in b.mig
            ]
            if created:
                done.info["migCreated"] = created
        if not b.cpuset:
            done.info["cpusetSource"] = "shared pool (the binding names no cpuset)"
        rec = Record(
            workload=b.workload, placement=b.placement, pid=done.pid, start_time=done.start_time, log=str(done.log),
            exit_file=str(done.exit_file), cpuset=cpus.format(), info=done.info, exclusive=b.exclusive,
            cgroup=str(done.group.path) if done.group is not None else None,
        )  # fmt: skip
        self.procs[b.workload] = done.proc
        self.state.records[b.workload] = rec
        self.state.save()
        log.info("started %s pid %d on CPUs %s", b.workload, done.pid, done.info.get("affinity"))
        self._ack(rec)

    def _ack(self, rec: Record) -> None:
        try:
            self.server.ack(rec.workload)
        except ServerError as exc:
            if exc.status in (404, 409):  # released or rebound meanwhile: the next sync forgets it
                log.warning("ack of %s refused (%s)", rec.workload, exc)
            return
        rec.acked = True
        self.state.save()

    def _reject(self, b: AgentBinding, reason: str) -> None:
        log.warning("rejecting %s: %s", b.workload, reason)
        if len(reason) > MAX_REASON:  # the server caps reasons; say how much was cut
            reason = reason[: MAX_REASON - 40] + f" ... ({len(reason) - MAX_REASON + 40} more characters)"
        try:
            self.server.reject(b.workload, reason)
        except ServerError as exc:
            log.warning("reject of %s failed (%s); retried next sync", b.workload, exc)

    def _forget(self, rec: Record, why: str) -> None:
        if rec.phase == "Running":
            log.info("stopping %s pid %d: %s", rec.workload, rec.pid, why)
            stop(rec.pid, rec.start_time, self.stop_grace)
            proc = self.procs.get(rec.workload)
            if proc is not None:
                proc.poll()
        self._drop_group(rec)
        self._destroy(rec.info.pop("migCreated", None) or [])
        self.procs.pop(rec.workload, None)
        del self.state.records[rec.workload]
        self.state.save()

    # Processes ---------------------------------------------------------------------------------
    def poll(self) -> None:
        """Record the end of every process that has exited since the last poll."""
        changed = False
        for key, rec in self.state.records.items():
            if rec.phase != "Running":
                continue
            proc = self.procs.get(key)
            if proc is not None:
                code = proc.poll()
                if code is None:
                    continue
                written = read_exit_code(Path(rec.exit_file))
                self._ended(rec, written if written is not None else code, "")
            elif not is_running(rec.pid, rec.start_time):
                self._ended(rec, read_exit_code(Path(rec.exit_file)), "")
            else:
                continue
            changed = True
        if changed:
            self.state.save()

    def _ended(self, rec: Record, code: int | None, why: str) -> None:
        rec.exit_code = code
        if code == 0:
            rec.phase, rec.reason = "Succeeded", why or "exited with code 0"
        elif code is None:
            rec.phase, rec.reason = "Failed", (why + "; " if why else "") + "exit status unknown"
        else:
            described = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            rec.phase, rec.reason = "Failed", f"{why}: {described}" if why else described
        self._drop_group(rec)
        self._destroy(rec.info.pop("migCreated", None) or [])

    def _drop_group(self, rec: Record) -> None:
        if rec.cgroup:
            Group(Path(rec.cgroup)).remove()

    def _running(self) -> list[Record]:
        return [r for r in self.state.records.values() if r.phase == "Running"]

    # Status ------------------------------------------------------------------------------------
    def report(self) -> None:
        """Send every status the server has not accepted yet (Running once, then the end)."""
        for rec in list(self.state.records.values()):
            if rec.reported == rec.phase or not rec.acked:
                continue
            info = {**rec.info, "log": rec.log}
            try:
                self.server.status(rec.workload, rec.phase, rec.reason, rec.exit_code, info)
            except ServerError as exc:
                if exc.status not in (404, 409):
                    log.warning("status %s of %s not sent (%s); retried", rec.phase, rec.workload, exc)
                    continue
            rec.reported = rec.phase
            self.state.save()

    def stop_all(self) -> None:
        """Stop every running process (used by `finesched up` on exit, not by a plain agent restart)."""
        stopped = self._running()
        for rec in stopped:
            stop(rec.pid, rec.start_time, self.stop_grace)
        self.poll()
        for rec in stopped:
            if rec.phase != "Running":
                rec.reason = f"stopped by the agent on its exit ({rec.reason})"
        self.state.save()
