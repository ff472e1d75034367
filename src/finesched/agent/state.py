"""The agent's state file: which processes it started, for which binding, and what is still unreported.

Written atomically (temporary file + rename) after every change, so an agent killed at any point
restarts with a consistent view: processes that still run are adopted, the others' ends reported.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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
    cgroup: str | None = None
    exclusive: bool = False
    phase: str = "Running"
    exit_code: int | None = None
    reason: str = ""
    reported: str = ""
    acked: bool = False


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
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"agent state file {path}: version {data.get('version')!r}, expected {STATE_VERSION}")
        records = {key: Record(**value) for key, value in (data.get("workloads") or {}).items()}
        return cls(path, records)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        body = {"version": STATE_VERSION, "workloads": {k: asdict(r) for k, r in sorted(self.records.items())}}
        tmp.write_text(json.dumps(body, indent=1))
        os.replace(tmp, self.path)
