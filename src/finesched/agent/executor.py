"""The Deploy Executor (S0.6): turns this node's bindings into confined processes and reports their ends.

Each `sync` compares the server's bindings for this node with the processes the agent runs:

1. A process whose binding is gone (workload deleted, released) or replaced by another placement
   (other CPUs or devices, or a fresh unacked binding where the agent had acked one) is stopped
   and forgotten.
2. A new binding is verified (right node, a command, CPUs online and not held by another binding's
   cpuset, devices present and healthy); a failure is rejected with the reasons, so the server
   releases it and requeues the workload. LS and BE workloads hold no CPUs: a binding is never
   refused because of them.
3. The node's CPU pools are recomputed with the new bindings (state/pools.py, as koordlet keeps
   them) and every running LS/BE workload whose pool changed is moved (agent/pools.py) *before*
   the new ones start; then each good binding is launched in its cgroups, recorded, acked, and
   reported Running with what took effect. MIG instances are resolved first (mig.py): an existing
   instance's UUID, or on a dynamic card one created through NVML, which is destroyed again when
   its workload ends or its binding goes.
   Each process runs as its tenant's user (agent/identity.py: the tenant's runAs, else a uid of
   the agent's range; the agent's own when it is not root), in a working directory of its own
   (agent/workdirs.py), optionally in a sandbox (agent/sandbox.py); a binding whose user cannot
   be had (the range used up, a runAs this node cannot apply) is rejected with the reason.
4. An acked binding the agent has no record of (its state was lost, or it was bound while the
   agent was replaced) is rejected with a reason, never silently kept.

A workload forgotten (its binding gone) while it ran loses its working directory at once; one whose
process had ended keeps it for the retention time (`--keep-finished`), and its log, in the agent's
private directory for `finesched logs`, for `--keep-logs` (agent/retention.py). Both are named by
the workload's uid when the server gives one, so a workload created with the name of a deleted one
starts with a directory and a log of its own; a binding of another object of a recorded name
replaces the record as a new placement would.

`poll` notices ended processes (exit code 0 -> Succeeded, else Failed; OOMKilled when the kernel
killed it for its memory limit) and gives their CPUs back to the pools; `report` sends every
status the server has not accepted yet, so a status survives network errors and agent restarts.

One binding never stops the others: if handling it raises, it alone is set aside (agent/aside.py:
rejected with the error as the reason, not retried for the same binding version) and the agent
goes on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from finesched.agent import retention
from finesched.agent.aside import SetAside
from finesched.agent.binding import AgentBinding, MIGUse
from finesched.agent.cgroup import CgroupSupport
from finesched.agent.cgroup_groups import Group, make_group, sweep
from finesched.agent.discover import Discovery
from finesched.agent.identity import Identity, IdentityError, Users
from finesched.agent.launch import LaunchError, is_running, launch, limits_of, read_exit_code, stop
from finesched.agent.mig import MIGControl, MIGError
from finesched.agent.names import key_hash, safe_name
from finesched.agent.pools import PoolKeeper
from finesched.agent.sandbox import Sandbox
from finesched.agent.state import AgentState, Record
from finesched.agent.workdirs import WorkDirs, default_work_root
from finesched.cpuset import CPUSet
from finesched.private import private_dir
from finesched.state.pools import Holder

log = logging.getLogger("finesched.agent")

#: Longest reason the control plane accepts in a reject or status.
MAX_REASON = 4096
UNKNOWN_AFTER_RESTART = "the agent has no process for this acked binding (agent state lost or replaced); released"
OOM_KILLED = "OOMKilled"
SWEEP_S = 30.0  # how often leftover cgroups are looked for


class ServerError(Exception):
    """A refused call; `status` is the HTTP status (0 when the server could not be reached)."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(f"{status}: {message}" if status else message)


class ServerPort(Protocol):
    """What the executor needs from the control plane (client.py implements it over HTTP)."""

    def ack(self, workload: str, object_uid: str = "") -> None: ...
    def reject(self, workload: str, reason: str, object_uid: str = "") -> None: ...
    def status(
        self, workload: str, phase: str, reason: str, exit_code: int | None, info: dict[str, Any], object_uid: str = ""
    ) -> None: ...


def rundir_of(data: Path, workload: str, object_uid: str = "") -> Path:
    """The agent's private directory of a workload (the object `object_uid`), where its log and exit
    file live: ``<data>/workloads/<safe name>`` (agent/names.py), 0700 like the data directory."""
    return data / "workloads" / safe_name(workload, object_uid)


OBJECT_FILE = "object.json"


def write_object(rundir: Path, workload: str, object_uid: str) -> None:
    """Say in `rundir` whose it is (`finesched logs --data` finds a workload's logs by it)."""
    path = rundir / OBJECT_FILE
    path.write_text(json.dumps({"workload": workload, "uid": object_uid}), encoding="utf-8")
    os.chmod(path, 0o600)


def rundirs_of(data: Path, workload: str) -> list[Path]:
    """Every log directory of objects named `workload` under `data`, the newest output first (the
    current object's, then deleted ones' still kept): read without a server (`logs --data`)."""
    found = [rundir_of(data, workload)] if (rundir_of(data, workload) / "output.log").is_file() else []
    with contextlib.suppress(OSError):
        for entry in os.scandir(data / "workloads"):
            try:
                named = json.loads(Path(entry.path, OBJECT_FILE).read_text(encoding="utf-8")).get("workload")
            except (OSError, ValueError, AttributeError):
                continue
            if named == workload and Path(entry.path, "output.log").is_file():
                found.append(Path(entry.path))
    return sorted(set(found), key=lambda p: (p / "output.log").stat().st_mtime, reverse=True)


class Executor:
    def __init__(
        self,
        data: Path,
        server: ServerPort,
        cgroups: CgroupSupport,
        stop_grace: float = 5.0,
        mig: MIGControl | None = None,
        users: Users | None = None,
        work_root: Path | None = None,
        sandbox: Sandbox | None = None,
        keep_finished_s: float = 3600.0,
        keep_logs_s: float = 7 * 86400.0,
    ):
        """`users`: who workloads run as (default: this process's policy, agent/identity.py);
        `work_root`: where their working directories go (agent/workdirs.py); `sandbox`: none or
        bwrap (agent/sandbox.py); `keep_finished_s`, `keep_logs_s`: how long a finished workload's
        working directory and log are kept (agent/retention.py). ValueError for a state file or
        work root that cannot serve."""
        self.data = private_dir(data)
        private_dir(data / "workloads")
        self.server = server
        self.cgroups = cgroups
        self.stop_grace = stop_grace
        self.mig = mig
        self.users = users or Users.for_agent(data)
        self.sandbox = sandbox or Sandbox()
        self.state = AgentState.load(data / "agent-state.json")
        self.procs: dict[str, Any] = {}  # workload -> Popen, for children of this incarnation
        #: The CPUs this agent may use (a confined agent cannot pin a child outside them).
        self.allowed = CPUSet(os.sched_getaffinity(0))
        #: Groups of agents sharing a machine (or a cgroup) never meet: one scope per data directory.
        self.scope = "agent-" + key_hash(str(data.resolve()), 12)
        self.workdirs = WorkDirs(work_root or default_work_root(data), self.scope, self.users.root)
        self.workdirs.prepare()
        self.keeper = PoolKeeper()
        self.discovery: Discovery | None = None  # the latest, from sync
        self.aside = SetAside(self._send_reject)
        self.keep_finished_s, self.keep_logs_s = keep_finished_s, keep_logs_s
        self._retention_swept = 0.0
        self._swept = time.monotonic()
        self._guard = self.aside.guard

    # Start-up ----------------------------------------------------------------------------------
    def adopt(self) -> dict[str, str]:
        """Re-adopt recorded processes that still run; record how the others ended. workload -> what.

        Adopted processes are put back in their pools on the next sync (the agent may have died
        in the middle of a move)."""
        outcome: dict[str, str] = {}
        for key, rec in self.state.records.items():
            if rec.phase != "Running":
                outcome[key] = f"{rec.phase} (status pending)"
            elif is_running(rec.pid, rec.start_time):
                outcome[key] = f"adopted pid {rec.pid}"
                self.keeper.adopted.add(key)
            else:
                self._ended(rec, read_exit_code(Path(rec.exit_file)), "ended while the agent was down")
                outcome[key] = f"{rec.phase} while the agent was down"
        self.state.save()
        self.sweep()
        return outcome

    def sweep(self) -> int:
        """Remove this agent's cgroups that no running workload uses (a group whose last process
        was not reaped yet when its workload ended stays until the next sweep); how many are left."""
        keep = {d for r in self._running() if (g := Group.from_record(r.cgroup)) is not None for d in g.dirs}
        self._swept = time.monotonic()
        return sweep(self.cgroups, self.scope, keep)

    # Bindings ----------------------------------------------------------------------------------
    def sync(self, bindings: list[AgentBinding], discovery: Discovery) -> None:
        self.discovery = discovery
        current = {b.workload: b for b in bindings}
        for key, rec in list(self.state.records.items()):
            b = current.get(key)
            if b is None:
                self._guard(key, lambda rec=rec: self._forget(rec, "binding gone"))
            elif rec.object_uid and b.object_uid != rec.object_uid:
                self._guard(key, lambda rec=rec: self._forget(rec, "binding of another object of this name"))
            elif b.placement != rec.placement or (rec.acked and not b.acked):
                self._guard(key, lambda rec=rec: self._forget(rec, "binding replaced by a new placement"))
        self.aside.prune(current)
        starting: list[AgentBinding] = []
        users: dict[str, Identity] = {}
        for b in bindings:
            if not self.aside.holds(b.workload):
                self._guard(b.workload, lambda b=b: self._admit(b, discovery, starting, users), b)
        self._guard("(pools)", lambda: self._keep_pools(starting))
        for b in starting:
            self._guard(b.workload, lambda b=b: self._start(b, discovery, users[b.workload]), b)

    def _admit(
        self, b: AgentBinding, discovery: Discovery, starting: list[AgentBinding], users: dict[str, Identity]
    ) -> None:
        """Ack a known binding, reject an unknown acked or impossible one, queue a good one in `starting`
        with the user it runs as in `users` (a binding whose user cannot be had is rejected here, before
        any other workload moves for it)."""
        rec = self.state.records.get(b.workload)
        if rec is not None:
            if not rec.acked:
                self._ack(rec)
            return
        if b.acked:
            self._reject(b, UNKNOWN_AFTER_RESTART)
            return
        reasons = self.verify(b, discovery, starting)
        if reasons:
            self._reject(b, "; ".join(reasons))
            return
        try:
            busy = {r.uid: r.tenant for r in self._running() if r.uid >= 0}
            users[b.workload] = self.users.identity(b.tenant, b.run_as, busy)
        except IdentityError as exc:
            self._reject(b, str(exc))
            return
        starting.append(b)

    def verify(self, b: AgentBinding, discovery: Discovery, starting: Sequence[AgentBinding] = ()) -> list[str]:
        """Every reason this node cannot run `b` now; empty when it can. Only another binding's
        cpuset (LSE, LSR, pinned) can hold CPUs: LS and BE workloads move out of the way."""
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
        for holder in self._holders(starting):
            overlap = b.cpuset & holder.cpuset
            if overlap:
                # the reason reaches the workload's tenant: a workload of another namespace goes unnamed
                same = holder.workload.partition("/")[0] == b.namespace
                who = holder.workload if same else "a workload of another namespace"
                reasons.append(f"CPUs {overlap} are held by {who} ({holder.qos} cpuset)")
        return reasons

    def _holders(self, starting: Sequence[AgentBinding]) -> list[Holder]:
        """Who holds CPUs: every running workload with a cpuset, and the bindings about to start."""
        held = [Holder(r.workload, r.own_cpuset, r.qos_class) for r in self._running() if r.own_cpuset]
        return held + [Holder(b.workload, b.cpuset, b.qos) for b in starting if b.cpuset]

    def usable(self) -> CPUSet:
        """The CPUs workloads may run on: online, and within the agent's own affinity."""
        online = self.discovery.online if self.discovery is not None else self.allowed
        return (online & self.allowed) or online

    def _keep_pools(self, starting: list[AgentBinding]) -> None:
        """Recompute the pools with `starting` and move every running workload whose pool changed."""
        if self.discovery is None:
            return
        changed = self.keeper.apply(self.discovery.node, self.usable(), self._holders(starting), self._running())
        for rec in changed:
            rec.reported = ""  # the server hears of the move (a Running status with the new CPUs)
        if changed:
            self.state.save()

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

    def _start(self, b: AgentBinding, discovery: Discovery, identity: Identity) -> None:
        where = self.keeper.placement(b.qos, b.cpuset, b.shared_numa)
        group = make_group(self.cgroups, self.scope, safe_name(b.workload), limits_of(b, where.cpus))
        created: list[list[int]] = []
        workdir: Path | None = None
        try:
            if b.mig:
                b, created = self._mig_instances(b, discovery)
            rundir = private_dir(rundir_of(self.data, b.workload, b.object_uid))
            write_object(rundir, b.workload, b.object_uid)
            workdir = self.workdirs.make(b.workload, identity.uid, identity.gid, b.object_uid)
            done = launch(b, discovery.node, where.cpus, rundir, workdir, group, identity, self.sandbox)
        except Exception as exc:
            self._destroy(created)
            if group is not None:
                group.remove()
            if workdir is not None:
                self.workdirs.remove(workdir)
            if not isinstance(exc, LaunchError | MIGError | OSError):
                raise  # the caller sets this binding aside
            self._reject(b, str(exc) if not isinstance(exc, OSError) else f"cannot prepare the workload: {exc}")
            return
        done.info["pool"] = where.pool
        if group is None:  # why not: the describe of the agent's cgroup support
            done.info["cgroup"] = self.cgroups.describe()
        if b.mig:
            done.info["mig"] = [
                {"minor": u.minor, "profile": u.profile, "start": u.start, "uuid": u.uuid} for u in b.mig
            ]
            if created:
                done.info["migCreated"] = created
        rec = Record(
            workload=b.workload, placement=b.placement, pid=done.pid, start_time=done.start_time, log=str(done.log),
            exit_file=str(done.exit_file), cpuset=where.cpus.format(), info=done.info, exclusive=b.exclusive,
            cgroup=group.to_record() if group is not None else None, qos=b.qos, shared_numa=list(b.shared_numa),
            pool=where.pool, tenant=b.tenant, uid=identity.uid, gid=identity.gid, workdir=str(workdir),
            object_uid=b.object_uid,
        )  # fmt: skip
        try:
            self.state.records[b.workload] = rec
            self.state.save()
        except Exception:  # an unrecorded process would run unaccounted for: it does not run at all
            self.state.records.pop(b.workload, None)
            stop(done.pid, done.start_time, 0.0, group)
            if group is not None:
                group.remove()
            self.workdirs.remove(workdir)
            raise
        self.procs[b.workload] = done.proc
        log.info("started %s pid %d on CPUs %s (%s) as %s", b.workload, done.pid, done.info.get("affinity"),
                 where.pool, identity.describe())  # fmt: skip
        self._ack(rec)

    def _ack(self, rec: Record) -> None:
        try:
            self.server.ack(rec.workload, rec.object_uid)
        except ServerError as exc:
            if exc.status in (404, 409):  # released or rebound meanwhile: the next sync forgets it
                log.warning("ack of %s refused (%s)", rec.workload, exc)
            return
        rec.acked = True
        self.state.save()

    def _reject(self, b: AgentBinding, reason: str) -> bool:
        log.warning("rejecting %s: %s", b.workload, reason)
        return self._send_reject(b.workload, reason, b.object_uid)

    def _send_reject(self, workload: str, reason: str, object_uid: str = "") -> bool:
        if len(reason) > MAX_REASON:  # the server caps reasons; say how much was cut
            reason = reason[: MAX_REASON - 40] + f" ... ({len(reason) - MAX_REASON + 40} more characters)"
        try:
            self.server.reject(workload, reason, object_uid)
        except ServerError as exc:
            if exc.status in (404, 409):  # that object is gone or no longer bound: nothing to reject
                log.info("reject of %s not needed (%s)", workload, exc)
                return True
            log.warning("reject of %s failed (%s); retried next sync", workload, exc)
            return False
        return True

    def _forget(self, rec: Record, why: str) -> None:
        group = Group.from_record(rec.cgroup)
        if rec.phase == "Running":
            log.info("stopping %s pid %d: %s", rec.workload, rec.pid, why)
            stop(rec.pid, rec.start_time, self.stop_grace, group)
            proc = self.procs.get(rec.workload)
            if proc is not None:
                proc.poll()
        if group is not None:
            group.remove()
        self._destroy(rec.info.pop("migCreated", None) or [])
        if rec.workdir and (rec.phase == "Running" or self.keep_finished_s <= 0):
            self.workdirs.remove(rec.workdir)  # stopped while it ran: nothing finished there
        self.procs.pop(rec.workload, None)
        del self.state.records[rec.workload]
        self.state.save()

    def unreadable(self, item: Any, reason: str) -> None:
        """A binding item that does not parse (agent/aside.py)."""
        self.aside.unreadable(item, reason)

    # Processes ---------------------------------------------------------------------------------
    def poll(self) -> None:
        """Record the end of every process that has exited since the last poll; give its CPUs back."""
        ended = False
        for key, rec in list(self.state.records.items()):
            if rec.phase == "Running":
                self._guard(key, lambda rec=rec: self._poll_one(rec))
                ended |= rec.phase != "Running"
        if ended:
            self.state.save()
        if ended or self.keeper.due():
            self._guard("(pools)", lambda: self._keep_pools([]))
        if time.monotonic() - self._swept >= SWEEP_S:
            self._guard("(cgroups)", self.sweep)
        self._guard("(retention)", self.sweep_finished)

    def sweep_finished(self, force: bool = False) -> list[Path]:
        """Remove finished workloads' working directories and logs past their retention
        (agent/retention.py); at most every `retention.sweep_every` seconds unless `force`."""
        due = min(retention.sweep_every(self.keep_finished_s), retention.sweep_every(self.keep_logs_s))
        if not force and time.monotonic() - self._retention_swept < due:
            return []
        self._retention_swept = time.monotonic()
        records = list(self.state.records.values())
        workdirs = [Path(r.workdir) for r in records if r.workdir]
        removed = retention.sweep(self.workdirs.scope, self.keep_finished_s, workdirs)
        rundirs = [Path(r.log).parent for r in records if r.log]
        removed += retention.sweep(self.data / "workloads", self.keep_logs_s, rundirs)
        if removed:
            log.info("removed past their retention: %s", ", ".join(p.name for p in removed))
            with contextlib.suppress(OSError):  # the last one: the scope goes too (not if others remain)
                self.workdirs.scope.rmdir()
        return removed

    def _poll_one(self, rec: Record) -> None:
        proc = self.procs.get(rec.workload)
        if proc is not None:
            code = proc.poll()
            if code is not None:
                written = read_exit_code(Path(rec.exit_file))
                self._ended(rec, written if written is not None else code, "")
        elif not is_running(rec.pid, rec.start_time):
            self._ended(rec, read_exit_code(Path(rec.exit_file)), "")

    def _ended(self, rec: Record, code: int | None, why: str) -> None:
        rec.exit_code = code
        for path in (rec.workdir, Path(rec.log).parent if rec.log else ""):
            if path:
                retention.retire(path)  # their retention counts from now
        group = Group.from_record(rec.cgroup)
        oom = group.oom_kills() if group is not None else None
        if code == 0:
            rec.phase, rec.reason = "Succeeded", why or "exited with code 0"
        elif oom:
            rec.phase, rec.reason = "Failed", OOM_KILLED
            cgroup = rec.info.get("cgroup") if isinstance(rec.info.get("cgroup"), dict) else {}
            limit = cgroup.get("memory.limit_in_bytes") or cgroup.get("memory.max") or "?"
            rec.info["oom"] = (f"{why}; " if why else "") + (
                f"the kernel OOM killer ended {oom} process(es) at the memory limit of {limit} bytes (exit code {code})"
            )
        elif code is None:
            rec.phase, rec.reason = "Failed", (why + "; " if why else "") + "exit status unknown"
        else:
            described = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            rec.phase, rec.reason = "Failed", f"{why}: {described}" if why else described
        # as when a container's main process ends: what it left behind in its groups goes too
        stop(rec.pid, rec.start_time, 0.0, group)
        if group is not None:
            group.remove()
        self._destroy(rec.info.pop("migCreated", None) or [])

    def _running(self) -> list[Record]:
        return [r for r in self.state.records.values() if r.phase == "Running"]

    # Status ------------------------------------------------------------------------------------
    def report(self) -> None:
        """Send every status the server has not accepted yet (Running, a move, then the end)."""
        for rec in list(self.state.records.values()):
            if rec.reported != rec.phase and rec.acked:
                self._guard(rec.workload, lambda rec=rec: self._report_one(rec))

    def _report_one(self, rec: Record) -> None:
        info = {**rec.info, "log": rec.log}
        try:
            self.server.status(rec.workload, rec.phase, rec.reason, rec.exit_code, info, rec.object_uid)
        except ServerError as exc:
            if exc.status not in (404, 409):
                log.warning("status %s of %s not sent (%s); retried", rec.phase, rec.workload, exc)
                return
        rec.reported = rec.phase
        self.state.save()

    def pools_report(self, discovery: Discovery) -> dict[str, Any]:
        """The node's pools and where each running workload runs (for the agent's report)."""
        self.discovery = self.discovery or discovery
        return self.keeper.report(discovery.node, self.usable(), self._running())

    def stop_all(self) -> None:
        """Stop every running process (used by `finesched up` on exit, not by a plain agent restart);
        the working directories of every ended workload go (nothing runs there any more)."""
        stopped = self._running()
        for rec in stopped:
            stop(rec.pid, rec.start_time, self.stop_grace, Group.from_record(rec.cgroup))
        self.poll()
        for rec in stopped:
            if rec.phase != "Running":
                rec.reason = f"stopped by the agent on its exit ({rec.reason})"
        for rec in self.state.records.values():
            if rec.phase != "Running" and rec.workdir:
                self.workdirs.remove(rec.workdir)
                rec.workdir = ""
        self.state.save()
        self.sweep()
