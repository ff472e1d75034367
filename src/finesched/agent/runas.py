"""The last step before a workload's command: become its user, then exec the command.

Run by the agent's root wrapper (agent/launch.py) as ``python -I -S runas.py ENV_FD WORKDIR UID
GID SWITCH -- COMMAND...``: isolated mode, no site, nothing imported but the standard library
(os, sys, json, ctypes, typing), so nothing a tenant controls (PYTHONPATH, a site directory, LD_PRELOAD:
the wrapper's environment is the agent's fixed minimal one) runs while it is still root.

In order:

1. read the command's environment (JSON) from file descriptor ENV_FD (an anonymous memory file
   the agent wrote; never a root process's environment) and close it;
2. with SWITCH=1 (a root agent): no supplementary groups, then gid, then uid (real, effective and
   saved), after dropping every capability from the bounding set when the uid is not root; the
   kernel clears a non-root uid's permitted and effective capabilities on the uid change, and
   the ambient set is cleared explicitly;
3. ``no_new_privs``: a setuid or file-capability binary gives nothing back;
4. umask 077 and the workload's working directory;
5. check what took effect (uids, gids, no groups, CapEff 0 for a non-root uid, NoNewPrivs 1)
   and exec the command with exactly that environment (PATH searched in it).

A failure before the exec prints one ``finesched:`` line to the workload's log and exits 126
(127: the command was not found), as a shell does.
"""

import ctypes
import json
import os
import sys
from typing import NoReturn

PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4


def fail(message: str, code: int = 126) -> NoReturn:
    sys.stderr.write(f"finesched: {message}\n")
    sys.stderr.flush()
    os._exit(code)


def prctl(libc: ctypes.CDLL, *args: int) -> None:
    values = [ctypes.c_ulong(a) for a in args] + [ctypes.c_ulong(0)] * (5 - len(args))
    if libc.prctl(*values) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63


def status() -> dict[str, str]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def become(libc: ctypes.CDLL, uid: int, gid: int) -> None:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    if uid != 0:
        for cap in range(last_cap() + 1):
            try:
                prctl(libc, PR_CAPBSET_DROP, cap)
            except OSError as exc:
                if exc.errno != 22:  # EINVAL: a capability this kernel does not know
                    raise
    try:
        prctl(libc, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    except OSError as exc:
        if exc.errno != 22:  # a kernel before ambient capabilities has none to clear
            raise
    os.setresuid(uid, uid, uid)


def verify(uid: int, gid: int, switch: bool) -> None:
    if switch and (os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups()):
        fail(f"the user change did not take effect (uids {os.getresuid()}, gids {os.getresgid()})")
    now = status()
    if now.get("NoNewPrivs") != "1":
        fail("no_new_privs did not take effect")
    if switch and uid != 0 and any(int(now.get(k, "0"), 16) for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb")):
        fail(f"capabilities left after the user change: CapEff {now.get('CapEff')}, CapBnd {now.get('CapBnd')}")


def main(argv: list[str]) -> None:
    try:
        end = argv.index("--")
        fd_text, workdir, uid_text, gid_text, switch_text = argv[:end]
        command = argv[end + 1 :]
        env_fd, uid, gid, switch = int(fd_text), int(uid_text), int(gid_text), switch_text == "1"
    except ValueError:
        fail("usage: runas.py ENV_FD WORKDIR UID GID SWITCH -- COMMAND...", 2)
    if not command:
        fail("no command to run", 2)
    try:
        with os.fdopen(env_fd, "rb") as f:
            env = json.loads(f.read().decode("utf-8"))
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("not an object of strings")
    except (OSError, ValueError) as exc:
        fail(f"cannot read the workload's environment: {exc}")
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        if switch:
            become(libc, uid, gid)
        prctl(libc, PR_SET_NO_NEW_PRIVS, 1)
    except OSError as exc:
        fail(f"cannot run as uid {uid} gid {gid}: {exc.strerror or exc}")
    os.umask(0o077)
    try:
        os.chdir(workdir)
    except OSError as exc:
        fail(f"cannot enter the working directory {workdir}: {exc.strerror or exc}")
    verify(uid, gid, switch)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        fail(f"cannot run {command[0]!r}: {exc.strerror or exc}", 127 if isinstance(exc, FileNotFoundError) else 126)


if __name__ == "__main__":
    main(sys.argv[1:])
