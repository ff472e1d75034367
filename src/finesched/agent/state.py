"""The agent's state file: which processes it started, for which binding, and what is still unreported.

Written atomically (temporary file + rename, mode 0600) after every change, so an agent killed at
any point restarts with a consistent view: processes that still run are adopted, the others' ends
reported.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from finesched.cpuset import CPUSet
from finesched.private import private_file, write_private

STATE_VERSION = 1


@dataclass
class Record:
    """One workload process. `phase` is Running until it ends; `reported` is the last phase the
    server accepted, so a status lost to a network error is sent again."""

    workload: str
    placement: str
    pid: int
    start_time: int
    log: str
    exit_file: str
    cpuset: str
    info: dict[str, Any] = field(default_factory=dict)
    #: The workload's cgroups (cgroup.Group.to_record; a path string from older agents), or None.
    cgroup: dict[str, Any] | str | None = None
    exclusive: bool = False
    #: LSE/LSR/LS/BE ("" from older agents: LSR when exclusive, else LS), the NUMA nodes of its
    #: shared pools (ConstrainedBurst), and the pool it runs in now (for people).
    qos: str = ""
    shared_numa: list[int] = field(default_factory=list)
    pool: str = ""
    phase: str = "Running"
    exit_code: int | None = None
    reason: str = ""
    reported: str = ""
    acked: bool = False
    #: Whose it is and who it runs as (agent/identity.py; -1 from older agents), and its
    #: working directory (agent/workdirs.py; "" from older agents), removed when it is forgotten.
    tenant: str = ""
    uid: int = -1
    gid: int = -1
    workdir: str = ""
    #: The workload object's uid, from its binding ("" from older agents or servers): a binding of
    #: another object of the same name replaces this record.
    object_uid: str = ""

    @property
    def qos_class(self) -> str:
        return self.qos or ("LSR" if self.exclusive else "LS")

    @property
    def own_cpuset(self) -> CPUSet:
        """The binding's own cpuset (empty for a workload that runs in a pool), from its placement."""
        try:
            return CPUSet(json.loads(self.placement).get("cpuset") or "")
        except (ValueError, TypeError, AttributeError):
            return CPUSet(self.cpuset) if self.exclusive else CPUSet()


@dataclass
class AgentState:
    path: Path
    records: dict[str, Record] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> AgentState:
        """The saved state, or an empty one if there is none. A corrupt file is an error: adopting
        nothing would leave running processes unaccounted for."""
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(path)
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"agent state file {path} is unreadable ({exc}); move it away to start afresh") from None
        private_file(path)  # written by an older agent with the umask's mode: tightened, said in the log
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"agent state file {path}: version {data.get('version')!r}, expected {STATE_VERSION}")
        records = {}
        known = {f.name for f in fields(Record)}
        for key, value in (data.get("workloads") or {}).items():
            try:  # fields a newer agent wrote are dropped; a record without the required ones is an error
                records[key] = Record(**{k: v for k, v in value.items() if k in known})
            except (TypeError, AttributeError) as exc:
                raise ValueError(f"agent state file {path}: workload {key!r}: {exc}") from None
        return cls(path, records)

    def save(self) -> None:
        body = {"version": STATE_VERSION, "workloads": {k: asdict(r) for k, r in sorted(self.records.items())}}
        write_private(self.path, json.dumps(body, indent=1))
