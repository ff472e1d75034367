"""`finesched up`'s control plane, kept running: if the server process dies (a kill -9, an OOM kill, a
crash), it is started again on the same data directory while the local agent goes on running its
workloads, as a process supervisor (systemd's `Restart=on-failure`) would do it.

The restarted server keeps its replica identity (the data directory's `replica-id`), so it takes
its own previous lease over at once and rebuilds the cluster state from the store; the agent's next
report and binding sync find it. Restarts back off (1 s doubling to 30 s, reset once a server has run
for a minute), so a server that cannot start (its port taken meanwhile, a broken database) is not
restarted in a tight loop; every exit and restart is logged with the cause and the server log's path.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from finesched.private import open_private

log = logging.getLogger("finesched.up")

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
STEADY_AFTER_S = 60.0  # a server that ran this long before dying restarts after the first backoff again


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def end_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGTERM this process when `parent_pid` (the `finesched up` that started it)
    dies, even by SIGKILL: a server orphaned by a killed `up` would hold the port and the next `up`
    could not start. Exits at once when that parent is already gone."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        log.warning("cannot follow the parent's exit (prctl: %s)", os.strerror(ctypes.get_errno()))
    if os.getppid() != parent_pid:  # it died before the prctl took effect
        raise SystemExit(0)


def exit_cause(returncode: int) -> str:
    """'killed by SIGKILL' or 'exited with code 1', as a reader of the log wants it."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


class SupervisedServer:
    """One `finesched serve` child process, restarted when it dies until `stop()` is called."""

    def __init__(self, argv: Sequence[str], log_path: Path):
        self.argv = [*argv, "--parent-pid", str(os.getpid())]
        self.log_path = log_path
        self._output: IO[bytes] = open_private(log_path)  # the server's log: readable by its owner only
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self.process = self._spawn()
        self.restarts = 0
        self._watcher: threading.Thread | None = None

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.argv, stdout=self._output, stderr=subprocess.STDOUT, start_new_session=True)

    def supervise(self) -> None:
        """Watch the server from now on (call once it first answered: a server that cannot start at
        all is the caller's error to report, not one to retry)."""
        self._watcher = threading.Thread(target=self._watch, name="finesched-up-server", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        backoff = FIRST_BACKOFF_S
        while not self._closing.is_set():
            started = time.monotonic()
            process = self.process
            returncode = process.wait()
            if self._closing.is_set():
                return
            if time.monotonic() - started >= STEADY_AFTER_S:
                backoff = FIRST_BACKOFF_S
            log.warning(
                "the control plane (pid %d) %s; restarting it in %.0f s on the same data (see %s)",
                process.pid, exit_cause(returncode), backoff, self.log_path,
            )  # fmt: skip
            if self._closing.wait(backoff):
                return
            with self._lock:
                if self._closing.is_set():
                    return
                self.process = self._spawn()
                self.restarts += 1
            log.warning("the control plane restarted (pid %d, restart %d)", self.process.pid, self.restarts)
            backoff = min(MAX_BACKOFF_S, backoff * 2)

    def stop(self, grace: float = 15.0) -> None:
        """No more restarts; SIGTERM the server, SIGKILL it after `grace` seconds."""
        with self._lock:
            self._closing.set()
            process = self.process
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        self._output.close()
