"""Who a workload runs as on this node: its tenant's user, never the agent's root.

A binding names its tenant and the tenant's ``runAs`` (Tenant.spec.runAs, set by the admin). A
root agent runs the workload as that uid and gid, with no supplementary groups (Kubernetes'
runAsUser/runAsGroup, Slurm's submitting user); root only where runAs says ``allowRoot``. A
tenant without runAs runs as a uid the agent takes from its own range (``--tenant-uids
START-END``, default 200000-299999; gid = uid), as HTCondor's slot users: the first uid of the
range that no other tenant holds here, that no account or group of /etc/passwd or /etc/group
uses, and that no running workload of another tenant runs as. A runAs uid inside the range is
refused: the agent could give it to another tenant. The choice is kept per tenant
name in ``<data>/tenant-uids.json`` (mode 0600), so a tenant keeps its uid across agent
restarts and its workloads can share the files they make.

An agent that is not root cannot switch users: it runs every workload as itself, says so in
its reports (``tenantIsolation``: the server's ``TenantIsolation`` node condition) and the
scheduler then places one tenant's workloads at a time on the node, unless the admin who runs
the agent allows sharing (``--allow-tenant-sharing``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finesched.private import private_file, write_private

log = logging.getLogger("finesched.agent")

DEFAULT_TENANT_UIDS = "200000-299999"
#: The largest uid Linux gives out ((uid_t) -1 means "unchanged" to setresuid).
MAX_ID = 2**32 - 2
UIDS_FILE = "tenant-uids.json"
UIDS_VERSION = 1


class IdentityError(ValueError):
    """A workload this node cannot run as its tenant's user; the message is the reject reason."""


def parse_uid_range(text: str, option: str = "--tenant-uids") -> range:
    """``START-END`` (both included, 1 <= START <= END <= 4294967294) -> range; ValueError naming
    the option and the value otherwise."""
    start, sep, end = text.strip().partition("-")
    if not sep or not start.isdigit() or not end.isdigit():
        raise ValueError(f"{option} {text!r}: expected START-END, two whole numbers such as {DEFAULT_TENANT_UIDS}")
    low, high = int(start), int(end)
    if low < 1:
        raise ValueError(f"{option} {text!r}: START must be at least 1 (uid 0 is root)")
    if high > MAX_ID:
        raise ValueError(f"{option} {text!r}: END must be at most {MAX_ID}")
    if low > high:
        raise ValueError(f"{option} {text!r}: START must not be above END")
    return range(low, high + 1)


def format_range(ids: range) -> str:
    return f"{ids.start}-{ids.stop - 1}"


@dataclass(frozen=True)
class RunAs:
    """A tenant's runAs as the server sends it in a binding (already validated by the model)."""

    uid: int
    gid: int
    allow_root: bool = False

    @classmethod
    def parse(cls, data: Any) -> RunAs | None:
        """The binding's ``runAs`` (None: the tenant has none); ValueError for a malformed one."""
        if data is None:
            return None
        if not isinstance(data, Mapping):
            raise ValueError(f"runAs: an object with uid and gid, got {type(data).__name__}")
        out = []
        for name in ("uid", "gid"):
            value = data.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
                raise ValueError(f"runAs.{name}: a whole number from 0 to {MAX_ID}, got {value!r}")
            out.append(value)
        allow = data.get("allowRoot", False)
        if not isinstance(allow, bool):
            raise ValueError(f"runAs.allowRoot: true or false, got {allow!r}")
        return cls(out[0], out[1], allow)


@dataclass(frozen=True)
class Identity:
    """The user a workload runs as. `switch`: the agent changes to it (False: the agent runs the
    workload as itself, not being root); `source` says where it came from, for people."""

    uid: int
    gid: int
    switch: bool
    source: str

    def describe(self) -> str:
        return f"uid {self.uid} gid {self.gid} ({self.source})"


def system_ids(passwd: Path = Path("/etc/passwd"), group: Path = Path("/etc/group")) -> set[int]:
    """Every uid of `passwd` and gid of `group`: a range uid must be none of them (its gid is the
    same number, and a process of an existing account's uid or group's gid would get its files)."""
    ids: set[int] = set()
    for path in (passwd, group):
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(":")
            if len(fields) > 2 and fields[2].isdigit():
                ids.add(int(fields[2]))
    return ids


def mapped(uid: int, uid_map: Path = Path("/proc/self/uid_map")) -> bool:
    """Whether `uid` exists in this process's user namespace (an agent in a container may see
    only some uids; setresuid to another fails with EINVAL)."""
    try:
        lines = uid_map.read_text().splitlines()
    except OSError:
        return True
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            inside, _, count = (int(p) for p in parts)
            if inside <= uid < inside + count:
                return True
    return False


class TenantUids:
    """Per tenant name, the uid this node gave it from its range (the module docstring)."""

    def __init__(self, data: Path, ids: range, passwd: Path = Path("/etc/passwd"), group: Path = Path("/etc/group")):
        self.path = data / UIDS_FILE
        self.ids = ids
        self.passwd, self.group = passwd, group
        self.given: dict[str, int] = self._load()

    def _load(self) -> dict[str, int]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"tenant uid file {self.path} is unreadable ({exc}); move it away to start over") from None
        private_file(self.path)  # tightened (and said) if an older hand made it readable by others
        tenants = data.get("tenants") if isinstance(data, dict) else None
        if not isinstance(tenants, dict) or data.get("version") != UIDS_VERSION:
            raise ValueError(f"tenant uid file {self.path}: not a version {UIDS_VERSION} file; move it away")
        given: dict[str, int] = {}
        for tenant, uid in tenants.items():
            if isinstance(uid, int) and uid in self.ids:
                given[str(tenant)] = uid
            else:  # the range changed: the tenant gets a uid of the new one when it next runs here
                log.warning("tenant %s: uid %r is outside --tenant-uids %s now; a new one is given", tenant, uid,
                            format_range(self.ids))  # fmt: skip
        return given

    def owner(self, uid: int) -> str | None:
        """The tenant this node gave `uid` to, if any."""
        return next((t for t, u in self.given.items() if u == uid), None)

    def uid_of(self, tenant: str, busy: Iterable[int] = ()) -> int:
        """`tenant`'s uid: the one it has, else the first free one of the range (saved before it
        is used); IdentityError when the range has none left. `busy`: uids running workloads use."""
        if tenant in self.given:
            return self.given[tenant]
        taken = set(self.given.values()) | set(busy)
        system = system_ids(self.passwd, self.group)
        for uid in self.ids:
            if uid not in taken and uid not in system:
                self.given[tenant] = uid
                self._save()
                log.info("tenant %s runs as uid %d here (from --tenant-uids %s)", tenant, uid, format_range(self.ids))
                return uid
        raise IdentityError(
            f"no uid left for tenant {tenant}: --tenant-uids {format_range(self.ids)} is used up "
            f"({len(self.given)} tenants hold uids of it here, the rest are system accounts or running "
            "workloads); widen the range or give the tenant a spec.runAs"
        )

    def _save(self) -> None:
        body = {"version": UIDS_VERSION, "range": format_range(self.ids), "tenants": dict(sorted(self.given.items()))}
        write_private(self.path, json.dumps(body, indent=1) + "\n")


@dataclass
class Users:
    """How this agent picks a workload's user: as root, the tenant's runAs or a range uid; not
    root, itself. `allow_sharing` is the admin's word that tenants may share a non-isolating node."""

    uids: TenantUids
    root: bool
    allow_sharing: bool = False
    own: tuple[int, int] = (0, 0)

    @classmethod
    def for_agent(cls, data: Path, ids: range | None = None, allow_sharing: bool = False) -> Users:
        """This process's policy: root switches users, anyone else runs workloads as itself."""
        ids = ids if ids is not None else parse_uid_range(DEFAULT_TENANT_UIDS)
        return cls(TenantUids(data, ids), os.geteuid() == 0, allow_sharing, (os.getuid(), os.getgid()))

    def identity(self, tenant: str, run_as: RunAs | None, busy: Mapping[int, str] | None = None) -> Identity:
        """The user `tenant`'s workload runs as; IdentityError (the reject reason) when none can be.
        `busy`: uid -> tenant of the workloads running now."""
        if not self.root:
            uid, gid = self.own
            return Identity(uid, gid, False, f"the agent's own user: the agent is not root (tenant {tenant})")
        if run_as is not None:
            if 0 in (run_as.uid, run_as.gid) and not run_as.allow_root:
                raise IdentityError(f"tenant {tenant}'s runAs names root without allowRoot: refused")
            if run_as.uid in self.uids.ids:
                other = self.uids.owner(run_as.uid)
                holder = f"it is tenant {other}'s here" if other not in (None, tenant) else "it may be any tenant's"
                raise IdentityError(
                    f"tenant {tenant}'s runAs uid {run_as.uid} is inside this node's --tenant-uids "
                    f"{format_range(self.uids.ids)}, the uids it gives tenants without a runAs ({holder}: they "
                    "would share files and signals); give the tenant a uid outside that range"
                )
            for what, value in (("uid", run_as.uid), ("gid", run_as.gid)):
                if not mapped(value, Path(f"/proc/self/{what}_map")):
                    raise IdentityError(
                        f"tenant {tenant}'s runAs {what} {value} does not exist in this agent's user namespace "
                        f"(/proc/self/{what}_map): it cannot run as it"
                    )
            return Identity(run_as.uid, run_as.gid, True, f"tenant {tenant}'s runAs")
        others = {uid for uid, owner in (busy or {}).items() if owner != tenant}
        uid = self.uids.uid_of(tenant, others)
        return Identity(uid, uid, True, f"tenant {tenant}, from --tenant-uids {format_range(self.uids.ids)}")

    def report(self, sandbox: str = "none") -> dict[str, Any]:
        """``tenantIsolation`` for the agent's report: whether workloads run as their tenants'
        users here, why (not), and whether the admin lets tenants share the node anyway."""
        common = {"sandbox": sandbox, "allowTenantSharing": self.allow_sharing}
        if self.root:
            reason = (
                f"workloads run as their tenants' users (spec.runAs, else uids {format_range(self.uids.ids)}), "
                f"without capabilities, with no_new_privs; sandbox: {sandbox}"
            )
            return {"isolated": True, "reason": reason, "tenantUids": format_range(self.uids.ids), **common}
        reason = f"the agent runs as uid {self.own[0]}, not root: workloads cannot run as their tenants' users"
        return {"isolated": False, "reason": reason, **common}
