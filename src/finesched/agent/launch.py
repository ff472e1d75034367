"""Starting a workload process pinned to its binding, as its tenant's user (S0.6 deploy, S1.7 GPU
env, S3.9 cpuset, issue 25 isolation).

The process chain is ``/bin/sh`` wrapper (root) -> [``bwrap``: agent/sandbox.py] -> agent/runas.py
(root until it drops to the workload's user) -> the command:

* the wrapper runs with a fixed minimal environment (``PATH`` only), never the tenant's: nothing
  the tenant controls (LD_PRELOAD, PYTHONPATH) reaches a root process. It writes its own pid into
  each of the workload's cgroups' ``cgroup.procs`` before anything else runs (root-owned files:
  the workload cannot write its pid elsewhere), so the command and everything it starts are
  confined from their first instruction; the agent writes the pid again afterwards (a no-op when
  the wrapper did it) and records what took effect. Then it runs the rest and writes the exit
  status to ``exit-code`` in the agent's private directory of the workload, so an agent that
  restarts (and is no longer the parent) still learns how an adopted process ended;
* runas.py becomes the workload's user (agent/identity.py: no supplementary groups, no
  capabilities, no_new_privs), sets umask 077, enters the workload's working directory and execs
  the command with the environment built here from scratch, read from an anonymous memory file
  (never from a root process's environment);
* output goes to ``output.log`` in the agent's private directory (0700, the file 0600): the
  process holds it as its stdout and stderr only, and cannot open it, or anyone's, by path.

The command's environment: ``PATH`` (fixed: /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:
/sbin:/bin), ``HOME`` (its working directory), ``LANG=C.UTF-8``, ``USER``/``LOGNAME``, then the
workload's own ``env``, then what the agent owns (a workload's env cannot override it):
``NVIDIA_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES`` (GPU UUIDs, minors when a GPU has none;
``MIG-<uuid>`` for MIG instances; ``CUDA_DEVICE_ORDER=PCI_BUS_ID``); for a shared GPU the HAMi-core
limits ``CUDA_DEVICE_MEMORY_LIMIT_<i>`` (bytes) and ``CUDA_DEVICE_SM_LIMIT[_<i>]`` (percent), i = the
device's position among the visible ones; ``FINESCHED_DEVICES_<TYPE>`` (minors) for every type;
``FINESCHED_BINDING`` (the binding as JSON), ``FINESCHED_WORKLOAD``, ``FINESCHED_CPUSET`` (the CPUs at
start: a workload in a pool is moved when the pool changes). Nothing of the agent's own.

CPU affinity = the CPUs the executor chose: the binding's cpuset, or its QoS class's pool
(state/pools.py). Linux gives a new process the affinity of the thread that forks it, so the
launching thread pins itself, starts the child and restores its own mask; no code runs between
fork and exec.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finesched.agent.binding import AgentBinding
from finesched.agent.cgroup_groups import Group, Limits
from finesched.agent.identity import Identity
from finesched.agent.sandbox import RUNAS, Sandbox
from finesched.cpuset import CPUSet
from finesched.model.node import Node
from finesched.model.resources import CPU, GPU, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, MEMORY, ResourceVector
from finesched.model.workload import EXCLUSIVE_QOS
from finesched.private import open_private

#: Environment variables the agent owns: a workload's own env cannot override them.
OWNED_PREFIXES = ("FINESCHED_", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_")
#: The command's PATH whatever the agent's: what a login shell of an ordinary user gets.
FIXED_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The root wrapper's whole environment.
WRAPPER_ENV = {"PATH": FIXED_PATH}
#: sh -c WRAPPER finesched-run EXIT_FILE N PROCS_FILE_1..N [BWRAP...] RUNAS... COMMAND...
_WRAPPER = (
    'umask 077; f="$1"; n="$2"; shift 2; '
    'while [ "$n" -gt 0 ]; do '
    'echo "$$" > "$1" || echo "finesched: cannot join cgroup $1" >&2; shift; n=$((n-1)); '
    "done; "
    '"$@"; rc=$?; echo "$rc" > "$f"; exit "$rc"'
)
_pin_lock = threading.Lock()


class LaunchError(RuntimeError):
    """The process could not be started; the message is the reason reported to the server."""


@dataclass
class Launched:
    pid: int
    start_time: int
    log: Path
    exit_file: Path
    info: dict[str, Any]
    group: Group | None
    proc: subprocess.Popen[bytes] | None


def gpu_env(binding: AgentBinding, node: Node) -> dict[str, str]:
    """The GPU variables for `binding` on `node` (see the module docstring)."""
    grants = binding.devices.get(GPU, [])
    if not grants:
        return {"NVIDIA_VISIBLE_DEVICES": "none", "CUDA_VISIBLE_DEVICES": ""}
    if binding.mig:  # MIG instances (the executor resolved their UUIDs): MIG.md §4
        ids = ",".join(use.uuid for use in binding.mig if use.uuid)
        return {"NVIDIA_VISIBLE_DEVICES": ids, "CUDA_VISIBLE_DEVICES": ids}
    by_minor = {d.minor: d for d in node.devices_of(GPU)}
    ids = []
    for minor, _ in grants:
        device = by_minor.get(minor)
        ids.append(device.uuid if device is not None and device.uuid else str(minor))
    env = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(ids),
        "CUDA_VISIBLE_DEVICES": ",".join(ids),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    shared = any(_is_shared(amounts) for _, amounts in grants)
    if not shared:
        return env
    cores = []
    for i, (minor, amounts) in enumerate(grants):
        core = amounts.get(GPU_CORE, 100)
        cores.append(core)
        env[f"CUDA_DEVICE_SM_LIMIT_{i}"] = str(core)
        memory = _grant_memory(amounts, by_minor.get(minor))
        if memory:
            env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = str(memory)
    if len(set(cores)) == 1:
        env["CUDA_DEVICE_SM_LIMIT"] = str(cores[0])
    return env


def _is_shared(amounts: ResourceVector) -> bool:
    return amounts.get(GPU_CORE, 100) < 100 or amounts.get(GPU_MEMORY_RATIO, 100) < 100


def _grant_memory(amounts: ResourceVector, device: Any) -> int:
    """Bytes of GPU memory granted: gpu-memory, else the ratio of the card's memory."""
    if amounts.get(GPU_MEMORY):
        return int(amounts[GPU_MEMORY])
    total = device.resources.get(GPU_MEMORY, 0) if device is not None else 0
    return int(amounts.get(GPU_MEMORY_RATIO, 0)) * int(total) // 100


def workload_env(binding: AgentBinding, node: Node, cpus: CPUSet, workdir: Path, user: str = "") -> dict[str, str]:
    """The command's environment, from scratch (see the module docstring): fixed basics, the
    workload's own env, then the variables the agent owns."""
    env = {"PATH": FIXED_PATH, "HOME": str(workdir), "LANG": "C.UTF-8"}
    if user:
        env["USER"] = env["LOGNAME"] = user
    for key, value in (binding.spec.get("env") or {}).items():
        if not str(key).startswith(OWNED_PREFIXES):
            env[str(key)] = str(value)
    env.update(gpu_env(binding, node))
    for kind, grants in binding.devices.items():
        env[f"FINESCHED_DEVICES_{kind.upper().replace('-', '_').replace('.', '_')}"] = ",".join(
            str(minor) for minor, _ in grants
        )
    env["FINESCHED_WORKLOAD"] = binding.workload
    env["FINESCHED_CPUSET"] = cpus.format()
    env["FINESCHED_BINDING"] = json.dumps(dict(binding.raw), sort_keys=True, default=str)
    return env


def user_name(uid: int, tenant: str) -> str:
    """``USER`` for `uid`: its account name when /etc/passwd has one, else the tenant's name."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return tenant


def _env_file(env: dict[str, str]) -> int:
    """An anonymous memory file holding `env` as JSON, positioned at its start (close-on-exec: only
    the child it is passed to gets it)."""
    fd = os.memfd_create("finesched-env", os.MFD_CLOEXEC)
    try:
        data = json.dumps(env).encode("utf-8", "surrogateescape")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _quantity(binding: AgentBinding, part: str, name: str) -> int | None:
    """The workload's ``requests``/``limits`` amount of `name` in canonical units (None: not given)."""
    amounts = binding.spec.get(part) or {}
    if not isinstance(amounts, Mapping) or name not in amounts:
        return None
    try:
        return ResourceVector.parse({name: amounts[name]})[name]
    except (ValueError, KeyError):
        return None


def limits_of(binding: AgentBinding, cpus: CPUSet) -> Limits:
    """What the kernel enforces for `binding` on `cpus`: memory = its memory limit (a request is not
    a limit, as in Kubernetes), CPU quota = its CPU limit for LS and BE (LSE and LSR own their CPUs)."""
    cpu_limit = _quantity(binding, "limits", CPU)
    return Limits(
        cpus=cpus,
        mems=binding.numa,
        memory=_quantity(binding, "limits", MEMORY),
        cpu_quota=None if binding.qos in EXCLUSIVE_QOS else cpu_limit,
        cpu_request=_quantity(binding, "requests", CPU) or cpu_limit or 0,
    )


def launch(
    binding: AgentBinding,
    node: Node,
    cpus: CPUSet,
    rundir: Path,
    workdir: Path,
    group: Group | None,
    identity: Identity,
    sandbox: Sandbox | None = None,
) -> Launched:
    """Start the binding's command on `cpus` in `group` as `identity`, in `workdir` (made by the
    caller, owned by the workload's user), logging to ``<rundir>/output.log`` (rundir: the agent's
    private directory of the workload, made by the caller)."""
    command = binding.command
    if not command:
        raise LaunchError("the workload has no command")
    sandbox = sandbox or Sandbox()
    log, exit_file = rundir / "output.log", rundir / "exit-code"
    exit_file.unlink(missing_ok=True)
    env = workload_env(binding, node, cpus, workdir, user_name(identity.uid, binding.tenant))
    joins = group.procs_files() if group is not None else []
    env_fd = _env_file(env)
    drop = [sys.executable, "-I", "-S", str(RUNAS), str(env_fd), str(workdir), str(identity.uid), str(identity.gid),
            "1" if identity.switch else "0", "--"]  # fmt: skip
    argv = ["/bin/sh", "-c", _WRAPPER, "finesched-run", str(exit_file), str(len(joins)), *joins,
            *sandbox.wrap(workdir), *drop, *command]  # fmt: skip
    try:
        with _pin_lock, open_private(log) as out:
            before = os.sched_getaffinity(0)
            try:
                os.sched_setaffinity(0, set(cpus))
            except OSError as exc:
                raise LaunchError(f"cannot pin to CPUs {cpus}: {exc.strerror or exc}") from None
            try:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=WRAPPER_ENV, cwd="/",
                    start_new_session=True, pass_fds=(env_fd,),
                )  # fmt: skip
            except OSError as exc:
                raise LaunchError(f"cannot start {command[0]!r}: {exc.strerror or exc}") from None
            finally:
                os.sched_setaffinity(0, before)
    finally:
        os.close(env_fd)
    if group is not None:
        group.add(proc.pid)
    info = process_info(proc.pid, cpus, group)
    info["log"] = str(log)
    info["user"] = {"uid": identity.uid, "gid": identity.gid, "from": identity.source}
    info["workdir"] = str(workdir)
    info["sandbox"] = sandbox.kind
    return Launched(proc.pid, start_time(proc.pid) or 0, log, exit_file, info, group, proc)


def process_info(pid: int, cpus: CPUSet, group: Group | None) -> dict[str, Any]:
    """What took effect, for the workload status (``finesched describe``)."""
    try:
        affinity = CPUSet(os.sched_getaffinity(pid)).format()
    except OSError:
        affinity = "unknown (process gone)"
    info: dict[str, Any] = {"pid": pid, "cpuset": cpus.format(), "affinity": affinity}
    if group is not None:
        info["cgroup"] = {"paths": sorted(group.dirs), **group.applied}
    return info


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks): with the pid, names one process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return int(fields[19]) if len(fields) > 19 else None


def is_running(pid: int, started: int) -> bool:
    """The process `pid` that started at `started` still runs (not exited, not a zombie, not a reuse)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rpartition(")")[2].split()
    return len(fields) > 19 and fields[0] not in ("Z", "X") and int(fields[19]) == started


def read_exit_code(exit_file: Path) -> int | None:
    try:
        return int(exit_file.read_text().strip())
    except (OSError, ValueError):
        return None


def stop(pid: int, started: int, grace: float = 5.0, group: Group | None = None) -> None:
    """SIGTERM the workload's process group (and every process left in its cgroups), SIGKILL what
    still runs after `grace` seconds."""
    if not is_running(pid, started) and not (group and group.pids()):
        return
    _signal(pid, started, group, signal.SIGTERM)
    deadline, pause = time.monotonic() + grace, 0.005
    while time.monotonic() < deadline and (is_running(pid, started) or (group and group.pids())):
        time.sleep(pause)  # most processes end at once: look again soon, then every 50 ms
        pause = min(0.05, pause * 2)
    _signal(pid, started, group, signal.SIGKILL)


def _signal(pid: int, started: int, group: Group | None, sig: int) -> None:
    if is_running(pid, started):
        with contextlib.suppress(OSError):
            os.killpg(pid, sig)
    for stray in group.pids() if group is not None else ():
        with contextlib.suppress(OSError):
            os.kill(stray, sig)
