"""The node agent's main loop: register, then watch bindings and report, until told to stop.

Two clocks: bindings are fetched every `watch` seconds (a new binding starts within about that
long), the Resource Manager report (also the heartbeat) is sent every `interval` seconds after a
fresh discovery, so a GPU that starts failing or disappears is reported unhealthy. A server that
cannot be reached is retried on the next tick; the agent never exits because of it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finesched.agent.binding import AgentBinding, BindingError, parse_binding
from finesched.agent.cgroup import CgroupSupport, detect
from finesched.agent.client import AgentClient
from finesched.agent.discover import Discovery, discover
from finesched.agent.executor import Executor, ServerError
from finesched.agent.fake_nvml import FakeNVML
from finesched.agent.gpus import load_nvml
from finesched.agent.identity import Users
from finesched.agent.logs import LogServer, advertised_host
from finesched.agent.mig import MIGControl
from finesched.agent.report import build_report
from finesched.agent.sandbox import Sandbox
from finesched.agent.workdirs import default_work_root
from finesched.model.node import Node
from finesched.plugins.tenant_isolation import TENANT_ISOLATION_LABEL, isolation_label
from finesched.private import private_dir
from finesched.tls import TransportError, server_tls

log = logging.getLogger("finesched.agent")


@dataclass
class AgentConfig:
    server: str
    token: str
    data: Path
    node_name: str | None = None
    interval: float = 5.0
    watch: float = 1.0
    labels: dict[str, str] = field(default_factory=dict)
    #: Stop the workload processes when the agent stops (`finesched up`); a plain agent leaves
    #: them running so that its next start adopts them.
    stop_workloads_on_exit: bool = False
    #: Serve workload logs to the control plane (agent/logs.py) on this port (0: any free one);
    #: None: do not. `logs_host` is the address the server reaches this machine at (default: the
    #: local end of the route to the server), `logs_bind` the one listened on (default: the same).
    logs_port: int | None = None
    logs_host: str | None = None
    logs_bind: str | None = None
    #: The agent's serving certificate and key (PEM): with them the log port speaks HTTPS.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: Simulated GPUs instead of NVML (`finesched up --fake-gpus N[:MEMORY]`): (count, bytes each).
    fake_gpus: tuple[int, int] | None = None
    #: How GPUs in MIG mode are offered: static (assign existing instances) or dynamic (also create them).
    mig_mode: str = "static"
    #: The uids of tenants without a runAs (agent/identity.py); None: 200000-299999.
    tenant_uids: range | None = None
    #: Where workloads' working directories go (agent/workdirs.py); None: the default for this user.
    work_root: Path | None = None
    #: none, or bwrap (agent/sandbox.py).
    sandbox: str = "none"
    #: The admin lets tenants share this node although the agent cannot keep them apart (not root).
    allow_tenant_sharing: bool = False
    #: More directories the sandbox hides besides the data directory and the work root (`up`'s own).
    hide: tuple[Path, ...] = ()
    #: How long a finished workload's working directory and its log are kept (agent/retention.py).
    keep_finished_s: float = 3600.0
    keep_logs_s: float = 7 * 86400.0


def default_discovery(
    name: str | None, labels: dict[str, str], fake_gpus: tuple[int, int] | None = None, mig_mode: str = "static"
) -> Callable[[], Discovery]:
    """Discovery of this machine with NVML loaded once (an absent NVML is reported every time), or
    with `fake_gpus` (count, memory) simulated GPUs answering through the same NVML calls."""
    if fake_gpus is not None:
        nvml, why = FakeNVML.simulated_gpus(*fake_gpus), ""
        log.warning("SIMULATED GPUs: %s (no real GPU is used)", nvml.describe())
    else:
        nvml, why = load_nvml()

    def run() -> Discovery:
        return discover(name, nvml=nvml, labels=labels, load=lambda: (None, why), mig_mode=mig_mode)

    run.nvml = nvml  # type: ignore[attr-defined]  # the executor creates MIG instances through it
    return run


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        client: Any = None,
        discovery: Callable[[], Discovery] | None = None,
        cgroups: CgroupSupport | None = None,
        users: Users | None = None,
    ):
        """`discovery`, `cgroups` and `users` (who workloads run as) default to this machine's and
        this process's; ValueError for a data directory, work root or sandbox that cannot serve."""
        self.config = config
        self.client = client if client is not None else AgentClient(config.server, config.token)
        self.discover = discovery or default_discovery(
            config.node_name, config.labels, config.fake_gpus, config.mig_mode
        )
        self.cgroups = cgroups if cgroups is not None else detect()
        private_dir(config.data)
        nvml = getattr(self.discover, "nvml", None)
        users = users or Users.for_agent(config.data, config.tenant_uids, config.allow_tenant_sharing)
        work_root = config.work_root or default_work_root(config.data)
        self.sandbox = Sandbox.resolve(config.sandbox, (config.data, work_root, *config.hide))
        self.executor = Executor(config.data, self.client, self.cgroups, mig=MIGControl(nvml) if nvml else None,
                                 users=users, work_root=work_root, sandbox=self.sandbox,
                                 keep_finished_s=config.keep_finished_s, keep_logs_s=config.keep_logs_s)  # fmt: skip
        self.isolation = users.report(self.sandbox.kind)
        self.isolation_label = isolation_label(users.root, users.allow_sharing)
        self.logs: LogServer | None = None
        self.discovery: Discovery | None = None
        self.node: Node | None = None  # as registered
        self.bindings: list[AgentBinding] = []
        self.last_report_error = ""
        self.stopping = threading.Event()

    @property
    def name(self) -> str:
        assert self.discovery is not None, "start() first"
        return self.discovery.node.name

    def start(self) -> dict[str, str]:
        """Discover, adopt recorded processes, and register (retrying until the server answers)."""
        self.discovery = self._discover()
        isolation = self.isolation
        if isolation["isolated"]:
            log.info("tenant isolation: %s; working directories under %s", isolation["reason"],
                     self.executor.workdirs.root)  # fmt: skip
        else:
            shared = (
                "tenants may share it (--allow-tenant-sharing)"
                if isolation["allowTenantSharing"]
                else ("the scheduler places one tenant's workloads at a time on this node")
            )
            log.warning("tenant isolation: NO: %s; %s", isolation["reason"], shared)
        adopted = self.executor.adopt()
        for key, what in adopted.items():
            log.info("reconciled %s: %s", key, what)
        self._serve_logs()
        while not self.stopping.is_set():
            try:
                self.client.register(self.discovery.node)
                break
            except ServerError as exc:
                if exc.status not in (0, 502, 503, 504):
                    raise
                log.warning("registration failed (%s); retrying", exc)
                self.stopping.wait(min(self.config.watch, 1.0))
        self.node = self.discovery.node
        log.info("node %s registered: %s", self.name, self.discovery.sources)
        return adopted

    def _discover(self) -> Discovery:
        """Discover this machine; its node carries the tenant-isolation label (plugins/tenant_isolation.py)
        from its first registration, before any report says it."""
        found = self.discover()
        node = found.node
        if node.labels.get(TENANT_ISOLATION_LABEL) != self.isolation_label:
            data = node.model_dump(by_alias=True, exclude_none=True)
            data["labels"] = {**node.labels, TENANT_ISOLATION_LABEL: self.isolation_label}
            found.node = Node.model_validate(data)
        return found

    def _serve_logs(self) -> None:
        """Open the log port (config.logs_port); a port that cannot be opened leaves logs unserved,
        said in the log, and the agent runs on."""
        config = self.config
        if config.logs_port is None or self.logs is not None:
            return
        host = config.logs_host or advertised_host(config.server)
        # Grants are checked over the agent's own client (httpx clients may be shared between
        # threads): it verifies the server as the user said (--ca, --insecure, up's pinned certificate).
        try:
            self.logs = LogServer(config.data, self.client.verify_log_grant, self._runs, host, config.logs_port,
                                  config.logs_bind, server_tls(config.tls_cert, config.tls_key),
                                  unnamed=self._unnamed)  # fmt: skip
        except (OSError, TransportError) as exc:
            log.error("cannot serve logs on %s:%s (%s): `finesched logs` will not reach this node", host,
                      config.logs_port, exc)  # fmt: skip
            return
        self.logs.start()

    def _runs(self, workload: str) -> bool:
        record = self.executor.state.records.get(workload)
        return record is not None and record.phase == "Running"

    def _unnamed(self, workload: str) -> bool:
        record = self.executor.state.records.get(workload)
        return record is not None and not record.object_uid

    def close(self) -> None:
        """Stop serving logs (the workloads are left as they are)."""
        if self.logs is not None:
            self.logs.stop()
            self.logs = None

    def tick_bindings(self) -> None:
        """Fetch this node's bindings, apply them, and send pending statuses."""
        assert self.discovery is not None
        try:
            items = self.client.bindings(self.name)
        except ServerError as exc:
            log.warning("bindings not fetched: %s", exc)
            items = None
        if items is not None:
            parsed: list[AgentBinding] = []
            for item in items:
                try:
                    parsed.append(parse_binding(item))
                except BindingError as exc:
                    self.executor.unreadable(item, str(exc))
            self.bindings = parsed
            self.executor.sync(parsed, self.discovery)
        self.executor.poll()
        self.executor.report()

    def tick_report(self) -> None:
        """Rediscover, re-register when new hardware appeared, and send the report (heartbeat)."""
        assert self.node is not None
        self.discovery = self._discover()
        fresh = {(d.type, d.minor, d.mig is not None) for d in self.discovery.node.devices}
        if fresh - {(d.type, d.minor, d.mig is not None) for d in self.node.devices}:
            try:
                self.client.register(self.discovery.node)
                self.node = self.discovery.node
            except ServerError as exc:
                log.warning("re-registration failed: %s", exc)
        # the server checks free amounts against its own bindings: read them now, not a tick ago
        try:
            bindings = [parse_binding(item) for item in self.client.bindings(self.name)]
        except (ServerError, BindingError):
            bindings = self.bindings
        extra: dict[str, Any] = {"cgroup": self.cgroups.describe(), "agentPid": os.getpid(),
                                 "tenantIsolation": self.isolation}  # fmt: skip
        if self.logs is not None:
            extra["logs"] = {"url": self.logs.url}
        body = build_report(self.node, bindings, self.discovery, extra, self.executor.pools_report(self.discovery))
        try:
            self.client.report(self.name, body)
            self.last_report_error = ""
        except ServerError as exc:
            self.last_report_error = str(exc)
            log.warning("report refused: %s", exc)

    def run(self) -> None:
        """Start, then tick until `stopping` is set."""
        self.start()
        next_report = 0.0
        try:
            while not self.stopping.is_set():
                now = time.monotonic()
                try:
                    if now >= next_report:
                        next_report = now + self.config.interval
                        self.tick_report()
                    self.tick_bindings()
                except Exception:  # a daemon that dies leaves its node silent: log, keep going
                    log.exception("agent tick failed; retrying")
                self.stopping.wait(self.config.watch)
        finally:
            if self.config.stop_workloads_on_exit:
                self.executor.stop_all()
                self.executor.report()
            self.close()
