"""A multi-threaded, multi-process workload for pool tests (and bench/pools.py), and the CPUs its
threads may run on.

The workload (the system's python, 3 extra threads, a python child with 2 extra threads) writes
its own and its child's pid to the file named by its first argument (in a directory its user may
write to: reachable.py) and sleeps; the tests read every thread's ``Cpus_allowed_list`` from
``/proc/<pid>/task/*/status`` for those pids, independently of the agent's own process walk.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from reachable import SYSTEM_PYTHON

CPUS = sorted(os.sched_getaffinity(0))
CHILD = (
    "import threading, time\n"
    "for _ in range(2): threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    "time.sleep(3600)"
)
PROGRAM = f"""
import json, os, subprocess, sys, threading, time
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}])
for _ in range(3):
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
time.sleep(0.2)
with open(sys.argv[1] + ".tmp", "w") as f:
    json.dump([os.getpid(), child.pid], f)
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(3600)
"""


def command(pids_file: Path) -> list[str]:
    return [SYSTEM_PYTHON, "-c", PROGRAM, str(pids_file)]


def pids(pids_file: Path, timeout: float = 30.0) -> list[int]:
    end = time.monotonic() + timeout
    while not pids_file.is_file():
        if time.monotonic() > end:
            raise AssertionError(f"the workload never wrote {pids_file}")
        time.sleep(0.05)
    return list(json.loads(pids_file.read_text()))


def thread_cpus(process_ids: list[int]) -> dict[tuple[int, int], str]:
    """(pid, tid) -> Cpus_allowed_list, for every thread of every process in `process_ids`."""
    out = {}
    for pid in process_ids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                lines = (task / "status").read_text().splitlines()
            except OSError:  # the thread ended meanwhile
                continue
            for line in lines:
                if line.startswith("Cpus_allowed_list:"):
                    out[(pid, int(task.name))] = line.split(":", 1)[1].strip()
    return out


def all_on(process_ids: list[int]) -> set[str]:
    """The distinct CPU lists of the workload's threads (one element when they all agree)."""
    return set(thread_cpus(process_ids).values())
