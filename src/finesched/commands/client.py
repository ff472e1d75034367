"""Client commands against a running control plane: submit, get, describe, delete, watch, cordon, whoami.

Every command takes `--server URL` and `--token T` (or FINESCHED_SERVER / FINESCHED_TOKEN), `--ca FILE`
for an HTTPS server whose certificate the system does not trust (FINESCHED_CA), and `-o
table|json|yaml` where it prints objects. A token is never sent over plain HTTP to another machine
unless `--insecure` (tls.py). Server errors are printed with their field paths
and exit 1; a server that cannot be reached is one line and exit 1.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from finesched.commands.common import fail
from finesched.commands.node_view import render_node
from finesched.commands.priority_views import NAMES as PRIORITY_CLASS_NAMES
from finesched.commands.tables import TABLE_OUTPUTS, Columns, col, event_time, print_table, simple_table
from finesched.commands.topology_views import NAMES as TOPOLOGY_NAMES
from finesched.model.manifest import load_manifests, to_manifest
from finesched.model.resources import human_amount, human_amounts
from finesched.tls import TransportError, client_options

if TYPE_CHECKING:  # httpx is imported where a request is made: `serve` and `--help` need it not
    import httpx

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

ServerOption = Annotated[
    str, typer.Option("--server", envvar="FINESCHED_SERVER", help="Control plane URL.", show_default=True)
]
TokenOption = Annotated[str, typer.Option("--token", envvar="FINESCHED_TOKEN", help="Bearer token.")]
CaOption = Annotated[
    Path | None,
    typer.Option("--ca", envvar="FINESCHED_CA", help="CA file (PEM) of the server's certificate (default: system's)."),
]
InsecureOption = Annotated[
    bool,
    typer.Option("--insecure", envvar="FINESCHED_INSECURE", help="Allow the token over plain HTTP to another host."),
]
OutputOption = Annotated[str, typer.Option("-o", "--output", help="table, wide, json or yaml.")]
NamespaceOption = Annotated[
    str | None,
    typer.Option("-n", "--namespace", help="Namespace (default: a tenant token's own, else default).",
                 show_default=False),
]  # fmt: skip
DEFAULT_SERVER = "http://127.0.0.1:8080"
DEFAULT_NAMESPACE = "default"
#: What a 401 adds: how to get a token and how to pass it.
TOKEN_HINT = (
    "an admin makes a token with `finesched token create --db DB --role tenant --tenant T` (or `--role admin`; "
    "`finesched up` writes its admin token to <data>/admin.token); pass it with --token or FINESCHED_TOKEN"
)
OUTPUTS = ("table", "wide", "json", "yaml")


class Client:
    """A thin httpx client that turns error answers into one readable failure."""

    def __init__(self, server: str, token: str, timeout: float | None = 30.0, *, ca: Path | None = None,
                 insecure: bool = False):  # fmt: skip
        if not token:
            _fail("no token: pass --token or set FINESCHED_TOKEN (finesched token create prints one)", code=2)
        try:
            options = client_options(server, ca, insecure)  # never a token in clear over the network (tls.py)
        except TransportError as exc:
            _fail(str(exc), code=2)
        import httpx

        self.http = httpx.Client(base_url=server.rstrip("/"), headers={"Authorization": f"Bearer {token}"},
                                 timeout=timeout, **options)  # fmt: skip
        self._whoami: dict[str, Any] | None = None
        #: What a refused namespace's answer suggests ({ns}: the first namespace the token may use).
        self.advice = "pass -n {ns} (or {ns}/NAME)"

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            _fail(f"cannot reach {self.http.base_url}: {exc}")
        if response.status_code >= 400:
            _fail_response(response, self)
        return response.json()

    def whoami(self) -> dict[str, Any]:
        """Who the token is (GET /v1/whoami: role, tenant, node, namespaces), asked once."""
        if self._whoami is None:
            self._whoami = self.call("GET", "/v1/whoami")
        return self._whoami

    def namespace(self, given: str | None) -> str:
        """The namespace a command acts in, as kubectl's context gives one: `-n` when given, else a
        tenant token's own namespace (the first it may use), else `default`."""
        if given:
            return given
        mine = self.whoami().get("namespaces")
        return mine[0] if mine else DEFAULT_NAMESPACE

    def key(self, name: str, given: str | None) -> tuple[str, str]:
        """(namespace, name) of "NAME" (in `namespace(given)`) or "NAMESPACE/NAME"."""
        return _workload_key(name, given) if "/" in name else (self.namespace(given), name)

    def list_all(self, path: str, params: dict[str, Any] | None = None, chunk_size: int = 500) -> list[Any]:
        """Every item of a list endpoint, following its pages (`limit`, `metadata.continue`) to the end,
        as kubectl does with --chunk-size."""
        query = {**(params or {}), "limit": chunk_size}
        items: list[Any] = []
        while True:
            answer = self.call("GET", path, params=query)
            items += answer["items"]
            token = (answer.get("metadata") or {}).get("continue")
            if not token:
                return items
            query["continue"] = token


def _fail(message: str, code: int = 1) -> NoReturn:
    raise fail(message, code)


def _fail_response(response: httpx.Response, client: Client | None = None) -> NoReturn:
    """Print the server's refusal (every problem with its field path) and exit 1; a 401 says how to
    get a token, a 403 for a namespace which namespaces the token may use (asked with `client`)."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = response.text
    hint = refusal_hint(response.status_code, detail, client)
    if hint:
        detail = f"{detail}; {hint}"
    if isinstance(detail, list):
        for item in detail:
            loc = ".".join(str(p) for p in item.get("loc", []))
            shown = f" {item['input']!r}" if "input" in item else ""
            err.print(
                f"[bold red]error:[/] {escape(loc)}:{escape(shown)} {escape(item.get('msg', ''))}", soft_wrap=True
            )
    else:
        err.print(f"[bold red]error:[/] {response.status_code}: {escape(str(detail))}", soft_wrap=True)
    raise typer.Exit(1)


def server_world(server: str, token: str, *, ca: Path | None = None, insecure: bool = False) -> tuple[Any, str]:
    """(admission World of the tenants and priority classes the server holds that the token may see,
    "") or (None, why they could not be read): `validate` then checks against its files only."""
    import httpx

    from finesched.admission import World
    from finesched.model.manifest import API_VERSION, parse_manifest
    from finesched.model.tenant import Tenant

    try:
        http = httpx.Client(base_url=server.rstrip("/"), headers={"Authorization": f"Bearer {token}"}, timeout=30,
                            **client_options(server, ca, insecure))  # fmt: skip
    except TransportError as exc:
        return None, str(exc)
    found: dict[str, dict[str, Any]] = {"tenants": {}, "priorityclasses": {}, "topologies": {}}
    with http:
        try:
            who = http.get("/v1/whoami")
            if who.status_code != 200:
                return None, f"the server refused the token ({who.status_code})"
            for kind, objects in found.items():
                answer = http.get(f"/v1/{kind}", params={"limit": 5000})
                for item in answer.json().get("items", []) if answer.status_code == 200 else ():
                    objects[item["metadata"]["name"]] = item
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return None, f"cannot ask {server}: {exc}"
    parsed: dict[str, dict[str, Any]] = {"tenants": {}, "priorityclasses": {}, "topologies": {}}
    for (kind, objects), name_of in zip(found.items(), ("Tenant", "PriorityClass", "Topology"), strict=True):
        for name, item in objects.items():
            doc = {"apiVersion": API_VERSION, "kind": name_of, "metadata": {"name": name}, "spec": item.get("spec")}
            try:
                parsed[kind][name] = parse_manifest(doc)
            except ValueError:
                continue  # set aside by the server too
    mine = who.json()
    tenants = parsed["tenants"]
    if mine.get("role") == "tenant" and mine.get("tenant") and mine["tenant"] not in tenants:
        tenants[mine["tenant"]] = Tenant(name=mine["tenant"], namespaces=mine.get("namespaces") or [])
    return World(tenants, priority_classes=parsed["priorityclasses"], topologies=parsed["topologies"]), ""


def refusal_hint(status: int, detail: Any, client: Client | None) -> str:
    """What to do about a 401 (how to get a token) or a 403 naming a namespace (which namespaces the
    token may use, and `-n`); "" otherwise."""
    if status == 401:
        return TOKEN_HINT
    if status != 403 or not isinstance(detail, str) or not detail.startswith("namespace ") or client is None:
        return ""
    import httpx

    try:
        answer = client.http.get("/v1/whoami")
        mine = answer.json().get("namespaces") if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return "pass -n NAMESPACE (or NAMESPACE/NAME) for a namespace of your tenant"
    if not mine:
        return "this token may use no namespace"
    listed = ", ".join(mine)
    return f"this token may use namespace{'s' if len(mine) > 1 else ''} {listed}: {client.advice.format(ns=mine[0])}"


def _workload_key(name: str, namespace: str | None) -> tuple[str, str]:
    """(namespace, name) of "NAME" or "NAMESPACE/NAME" (a namespace has no "/"; a name stored by an
    older version may have one)."""
    if "/" in name:
        found, rest = name.split("/", 1)
        return found, rest
    return namespace or DEFAULT_NAMESPACE, name


def _check_output(output: str) -> None:
    if output not in OUTPUTS:
        _fail(f"-o {output!r}: use one of {', '.join(OUTPUTS)}", code=2)


def _dump(data: Any, output: str) -> None:
    if output == "json":
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False))


def submit(
    file: Annotated[
        list[Path],
        typer.Option(
            "-f", "--file", help="Manifest file(s): Workloads, Nodes, Tenants, Jobs, PriorityClasses, Topologies."
        ),
    ],
    server: ServerOption = DEFAULT_SERVER,
    token: TokenOption = "",
    ca: CaOption = None,
    insecure: InsecureOption = False,
    output: OutputOption = "table",
) -> None:
    """Send manifests to the server (checked here first by the server's own rules, as `finesched
    validate` does): topologies, priority classes, tenants, nodes, then workloads, then jobs."""
    from finesched.commands.common import admit_or_exit

    _check_output(output)
    admit_or_exit(file, warn=False)  # exits 1 naming every problem; references are the server's to check
    manifests = load_manifests(*file)  # sent as written: the server resolves what the files leave out
    client = Client(server, token, ca=ca, insecure=insecure)
    client.advice = "set metadata.namespace: {ns} in the manifests"
    results: list[dict[str, Any]] = []
    for topology in manifests.topologies:  # first: the gangs below may name them
        client.call("PUT", f"/v1/topologies/{topology.name}", json=to_manifest(topology))
        results.append({"kind": "Topology", "name": topology.name, "status": "applied"})
    for cls in manifests.priority_classes:  # first: the workloads below may name them
        client.call("PUT", f"/v1/priorityclasses/{cls.name}", json=to_manifest(cls))
        results.append({"kind": "PriorityClass", "name": cls.name, "status": "applied"})
    for tenant in manifests.tenants:
        client.call("PUT", f"/v1/tenants/{tenant.name}", json=to_manifest(tenant))
        results.append({"kind": "Tenant", "name": tenant.name, "status": "applied"})
    for node in manifests.nodes:
        client.call("PUT", f"/v1/nodes/{node.name}", json=to_manifest(node))
        results.append({"kind": "Node", "name": node.name, "status": "registered"})
    if manifests.workloads:
        answer = client.call("POST", "/v1/workloads", json=[to_manifest(w) for w in manifests.workloads])
        for item in answer["items"]:
            key = f"{item['metadata']['namespace']}/{item['metadata']['name']}"
            results.append({"kind": "Workload", "name": key, "status": item["status"]["phase"]})
    for job in manifests.jobs:
        answer = client.call("POST", "/v1/jobs", json=to_manifest(job))
        results.append({"kind": "Job", "name": answer["job"], "status": answer["status"]})
    if output not in TABLE_OUTPUTS:
        _dump(results, output)
        return
    rows = [(row["kind"], escape(row["name"]), row["status"]) for row in results]
    print_table(out, simple_table(f"{len(results)} object(s) submitted", ["kind", "name", "status"], rows))


ChunkOption = Annotated[
    int,
    typer.Option(
        "--chunk-size", "--limit", min=1, max=5000, help="Items per request; all pages are read (kubectl --chunk-size)."
    ),
]


def get(
    what: Annotated[str, typer.Argument(help="workloads, jobs, nodes, tenants, priorityclasses, topologies or events")],
    name: Annotated[str | None, typer.Argument(help="Only this one: NAME (or NAMESPACE/NAME)")] = None,
    server: ServerOption = DEFAULT_SERVER,
    token: TokenOption = "",
    ca: CaOption = None,
    insecure: InsecureOption = False,
    output: OutputOption = "table",
    namespace: NamespaceOption = None,
    tenant: Annotated[str | None, typer.Option("--tenant")] = None,
    phase: Annotated[str | None, typer.Option("--phase")] = None,
    node: Annotated[str | None, typer.Option("--node")] = None,
    job: Annotated[str | None, typer.Option("--job", help="Workloads: the slots of job NAME or NS/NAME.")] = None,
    kind_filter: Annotated[str | None, typer.Option("--kind", help="Events: of this kind (Workload, Node...).")] = None,
    obj: Annotated[str | None, typer.Option("--object", help="Events: of this object (e.g. NS/NAME).")] = None,
    chunk_size: ChunkOption = 500,
) -> None:
    """List workloads (filters: namespace, tenant, phase, node, job), jobs (namespace), nodes, tenants,
    priority classes, topologies (levels, domains per level) or events (kind, object); every page of
    the answer is read, --chunk-size items at a time. With NAME, that one object (`get workload web`,
    `get nodes n1`: singular or plural, as kubectl takes them; short names `no`, `ev`, `pc`, `topo`)."""
    _check_output(output)
    kind = kind_of(what)
    if kind is None:
        _fail(f"get {what!r}: use workloads, jobs, nodes, tenants, priorityclasses, topologies or events", code=2)
    if name is not None:
        given = {"--tenant": tenant, "--phase": phase, "--node": node, "--job": job, "--kind": kind_filter,
                 "--object": obj}  # fmt: skip
        filters_given = [flag for flag, value in given.items() if value]
        if filters_given:
            _fail(f"get {what} NAME takes no filter ({', '.join(filters_given)}): give a NAME or filters", code=2)
        if kind == "events":
            _fail("get events takes no NAME: use --object NAMESPACE/NAME (or --kind)", code=2)
        _get_one(kind, name, Client(server, token, ca=ca, insecure=insecure), namespace, output)
        return
    filters = {"namespace": namespace, "tenant": tenant, "phase": phase, "node": node, "job": job}
    params = {k: v for k, v in filters.items() if v} if kind == "workloads" else None
    if kind == "jobs" and namespace:
        params = {"namespace": namespace}
    if kind == "events":
        params = {k: v for k, v in {"kind": kind_filter, "object": obj}.items() if v}
    items = Client(server, token, ca=ca, insecure=insecure).list_all(f"/v1/{kind}", params, chunk_size)
    if output not in TABLE_OUTPUTS:
        _dump(items, output)
        return
    print_table(out, _TABLES[kind](items, output == "wide"), wide=output == "wide")


#: The kinds `get`, `describe` and `delete` take, by every name they take them: singular, plural
#: and kubectl's short names (nodes `no`, events `ev`, priority classes `pc`).
KIND_NAMES: dict[str, tuple[str, ...]] = {
    "workloads": ("workload", "workloads"),
    "jobs": ("job", "jobs"),
    "nodes": ("node", "nodes", "no"),
    "tenants": ("tenant", "tenants"),
    "priorityclasses": PRIORITY_CLASS_NAMES,
    "topologies": TOPOLOGY_NAMES,
    "events": ("event", "events", "ev"),
}
#: The kinds whose objects live in a namespace (NAME, NAMESPACE/NAME or -n).
NAMESPACED = ("workloads", "jobs")


def kind_of(word: str) -> str | None:
    """The kind (its plural, as the API's path names it) `word` names, or None."""
    return next((kind for kind, names in KIND_NAMES.items() if word in names), None)


def _get_one(kind: str, name: str, client: Client, namespace: str | None, output: str) -> None:
    """`get KIND NAME`: the object (json, yaml: the object itself, as kubectl prints it) or its row."""
    path = f"/v1/{kind}/{'/'.join(client.key(name, namespace))}" if kind in NAMESPACED else f"/v1/{kind}/{name}"
    item = client.call("GET", path)
    if kind == "jobs":  # the list's row: the job's view without the events `describe job` shows
        item = {k: v for k, v in item.items() if k != "events"}
    if output not in TABLE_OUTPUTS:
        _dump(item, output)
        return
    print_table(out, _TABLES[kind]([item], output == "wide"), wide=output == "wide")


WORKLOAD_COLUMNS = Columns(
    col("workload"), col("tenant", wide=True), col("phase", keep=True), col("node"), col("cpuset", wide=True),
    col("devices", wide=True), col("reason"),
)  # fmt: skip


def _workloads_table(items: list[dict[str, Any]], wide: bool) -> Table:
    table = WORKLOAD_COLUMNS.table(f"{len(items)} workload(s)", wide=wide)
    for item in items:
        status = item["status"]
        binding = status.get("binding") or {}
        key = f"{item['metadata']['namespace']}/{item['metadata']['name']}"
        WORKLOAD_COLUMNS.add_row(table, escape(key), escape(status["tenant"]), status["phase"],
                                 escape(status.get("node") or ""), binding.get("cpuset", ""),
                                 escape(_devices_text(binding.get("devices") or {})),
                                 escape(status.get("reason") or ""), wide=wide)  # fmt: skip
    return table


def _devices_text(devices: dict[str, list[dict[str, Any]]]) -> str:
    parts = []
    for kind, grants in devices.items():
        for grant in grants:
            amounts = ",".join(f"{k}={human_amount(k, v)}" for k, v in grant.get("resources", {}).items())
            parts.append(f"{kind}{grant['minor']}({amounts})")
    return " ".join(parts)


def _problems(status: dict[str, Any]) -> list[dict[str, Any]]:
    """An object's conditions that say something is wrong: SetAside, and TenantIsolation=False (a
    node whose agent cannot keep tenants apart; True is the normal state, shown by `describe node`)."""
    return [c for c in status.get("conditions") or () if not (c["type"] == "TenantIsolation" and c["status"] == "True")]


def _conditions_text(status: dict[str, Any]) -> str:
    """An object's conditions, e.g. "SetAside: cannot be loaded: ..." ("" when it has none)."""
    return "; ".join(f"{c['type']}: {c.get('message', '')}" for c in _problems(status))


NODE_COLUMNS = Columns(
    col("name"), col("status", keep=True), col("workloads", right=True, keep=True), col("heartbeat", wide=True),
    col("allocatable"), col("conditions"),
)  # fmt: skip


def _nodes_table(items: list[dict[str, Any]], wide: bool) -> Table:
    table = NODE_COLUMNS.table(f"{len(items)} node(s)", wide=wide)
    for item in items:
        status = item["status"]
        allocation = status.get("allocation") or {}
        state = ("Ready" if status["ready"] else "NotReady") + (",cordoned" if status["cordoned"] else "")
        NODE_COLUMNS.add_row(table, escape(item["metadata"]["name"]), state,
                             str(len(allocation.get("workloads", []))), status.get("heartbeat") or "-",
                             escape(human_amounts(item["spec"].get("allocatable") or {})),
                             escape(_conditions_text(status)), wide=wide)  # fmt: skip
    return table


def _tenants_table(items: list[dict[str, Any]], wide: bool) -> Table:
    rows = []
    for item in items:
        spec = item["spec"] or {}
        name = item["metadata"]["name"]
        caps = "; ".join(f"{cap} {human_amounts(spec[cap])}" for cap in ("quota", "min", "max") if spec.get(cap))
        namespaces = ", ".join((name, *(spec.get("namespaces") or ())))  # its own name's and those granted
        rows.append((escape(name), str(spec.get("weight", 1.0)), escape(caps) or "-",
                     escape(namespaces), escape(_conditions_text(item["status"]))))  # fmt: skip
    headers = ["name", col("weight", right=True), "quota, min, max", "namespaces", "conditions"]
    return simple_table(f"{len(items)} tenant(s)", headers, rows)


def _jobs_table(items: list[dict[str, Any]], wide: bool) -> Table:
    from finesched.commands.job_views import jobs_table

    return jobs_table(items, wide)


def _classes_table(items: list[dict[str, Any]], wide: bool) -> Table:
    from finesched.commands.priority_views import classes_table

    return classes_table(items, wide)


def _topologies_table(items: list[dict[str, Any]], wide: bool) -> Table:
    from finesched.commands.topology_views import topologies_table

    return topologies_table(items, wide)


def _events_table(items: list[dict[str, Any]], wide: bool) -> Table:
    rows = [(str(e["id"]), event_time(e["time"], wide), e["kind"], escape(e["object"]), escape(e["reason"]),
             escape(e["message"])) for e in items]  # fmt: skip
    headers = [col("id", right=True), "time (UTC)", "kind", "object", "reason", "message"]
    return simple_table(f"{len(items)} event(s)", headers, rows)


_TABLES = {"workloads": _workloads_table, "nodes": _nodes_table, "tenants": _tenants_table, "jobs": _jobs_table,
           "priorityclasses": _classes_table, "topologies": _topologies_table, "events": _events_table}  # fmt: skip


def describe(
    what: Annotated[str, typer.Argument(help="workload, job, node, tenant, priorityclass or topology")],
    name: Annotated[str, typer.Argument(help="NAME or NAMESPACE/NAME")],
    server: ServerOption = DEFAULT_SERVER,
    token: TokenOption = "",
    ca: CaOption = None,
    insecure: InsecureOption = False,
    namespace: NamespaceOption = None,
    output: OutputOption = "table",
) -> None:
    """A workload's status, binding (node, cpuset, devices, NUMA), what its agent applied, and events;
    a job's phase, failover regions and slots; a node's state, discovery, devices, CPU pools as its
    agent applies them, cgroup enforcement, and events; a tenant's spec and events; a priority
    class's value, policy and events; a topology's levels and each domain's nodes and free capacity;
    for nodes and tenants their conditions first (SetAside: why
    the scheduler leaves one out)."""
    _check_output(output)
    kind = kind_of(what)
    if kind is None or kind == "events":
        _fail(f"describe {what!r}: use workload, job, node, tenant, priorityclass or topology", code=2)
    client = Client(server, token, ca=ca, insecure=insecure)
    if kind == "nodes":
        _describe_node(name, client, output)
        return
    if kind == "tenants":
        _describe_tenant(name, client, output)
        return
    if kind == "priorityclasses":
        _describe_class(name, client, output)
        return
    if kind == "topologies":
        _describe_topology(name, client, output)
        return
    namespace, name = client.key(name, namespace)
    if kind == "jobs":
        _describe_job(f"/v1/jobs/{namespace}/{name}", client, output)
        return
    _describe_workload(namespace, name, client, output)


def _describe_node(name: str, client: Client, output: str) -> None:
    """`describe node`: its conditions first, then state, discovery, devices, CPU pools and events."""
    node = client.call("GET", f"/v1/nodes/{name}")
    node_events = _object_events(client, "Node", name, node)
    if output not in TABLE_OUTPUTS:
        _dump({**node, "events": node_events}, output)
    else:
        _print_conditions(node.get("status") or {})
        render_node(out, node, node_events, output == "wide")


def _describe_workload(namespace: str, name: str, client: Client, output: str) -> None:
    """`describe workload`: status, binding (node, cpuset, devices, NUMA), what its agent applied, events."""
    item = client.call("GET", f"/v1/workloads/{namespace}/{name}")
    events = _object_events(client, "Workload", f"{namespace}/{name}", item)
    if output not in TABLE_OUTPUTS:
        _dump({**item, "events": events}, output)
        return
    status = item["status"]
    out.print(f"[bold]Workload[/] {escape(namespace)}/{escape(name)}  tenant {escape(status['tenant'])}")
    out.print(f"Phase:    {status['phase']}" + (f" ({escape(status['reason'])})" if status.get("reason") else ""))
    out.print(f"UID:      {item['metadata'].get('uid') or '-'}")
    binding = status.get("binding")
    if binding:
        out.print(f"Node:     {escape(binding['node'])}   acked: {binding.get('acked', False)}")
        out.print(f"Cpuset:   {binding['cpuset'] or '-'}")
        out.print(f"Devices:  {escape(_devices_text(binding['devices'])) or '-'}")
        numa = ", ".join(f"numa{g['numa']}: " + human_amounts(g["resources"]).replace(", ", ",")
                         for g in binding.get("numa", []))  # fmt: skip
        out.print(f"NUMA:     {escape(numa) or '-'}")
    info = status.get("info") or {}
    if info:
        out.print("Applied:")
        _print_applied(info, "  ")
    _print_events(events, output)


def _print_applied(info: dict[str, Any], indent: str) -> None:
    """What the node agent applied, a field a line: a mapping's fields and a list's items below it,
    one a line. A line is never wrapped by the console (soft wrap), so a path that is wider than the
    terminal is not broken inside a word: it stays whole for the terminal to fold and a copy to paste."""
    for key, value in info.items():
        if isinstance(value, dict) and value:
            out.print(f"{indent}{escape(str(key))}:", soft_wrap=True)
            _print_applied(value, indent + "  ")
        elif isinstance(value, list) and value:
            out.print(f"{indent}{escape(str(key))}:", soft_wrap=True)
            for item in value:
                out.print(f"{indent}  - {escape(str(item))}", soft_wrap=True)
        else:
            out.print(f"{indent}{escape(str(key))}: {escape(str(value))}", soft_wrap=True)


def _object_events(client: Client, kind: str, obj: str, item: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of `item` (read as kind `kind`, name `obj`): of this object only, by its uid, not
    of an earlier object of its name (as `kubectl describe`; a server that gives no uid: by name)."""
    params = {"kind": kind, "object": obj}
    uid = (item.get("metadata") or {}).get("uid")
    if uid:
        params["uid"] = uid
    return client.call("GET", "/v1/events", params=params)["items"]  # type: ignore[no-any-return]


def _print_events(events: list[dict[str, Any]], output: str) -> None:
    wide = output == "wide"
    rows = [(event_time(e["time"], wide), escape(e["reason"]), escape(e["message"])) for e in events]
    print_table(out, simple_table("events", ["time (UTC)", "reason", "message"], rows), wide=wide)


def _print_conditions(status: dict[str, Any]) -> None:
    """A node's or tenant's conditions, first: SetAside says why the scheduler leaves it out."""
    for condition in _problems(status):
        out.print(f"[bold red]{escape(condition['type'])}[/]: {escape(condition.get('message', ''))}")


def _describe_tenant(name: str, client: Client, output: str) -> None:
    """A tenant: conditions, effective spec (weight, quota, parent, namespaces... defaults named) and events."""
    from finesched.commands.tenant_views import print_tenant

    def show(item: dict[str, Any]) -> None:
        out.print(f"[bold]Tenant[/] {escape(name)}")
        _print_conditions(item["status"])
        print_tenant(out, item)

    _describe_with_events(client, output, f"/v1/tenants/{name}", "Tenant", name, show)


def _describe_class(name: str, client: Client, output: str) -> None:
    """A priority class: value, default, policy, description and its events (an admin's token sees them)."""
    from finesched.commands.priority_views import print_class

    _describe_with_events(client, output, f"/v1/priorityclasses/{name}", "PriorityClass", name,
                          lambda item: print_class(out, item))  # fmt: skip


def _describe_topology(name: str, client: Client, output: str) -> None:
    """A topology: its levels, then each domain's nodes and free/allocatable capacity, and its events."""
    from finesched.commands.topology_views import print_topology

    _describe_with_events(client, output, f"/v1/topologies/{name}", "Topology", name,
                          lambda item: print_topology(out, item, output == "wide"))  # fmt: skip


def _describe_with_events(
    client: Client, output: str, path: str, kind: str, name: str, show: Callable[[dict[str, Any]], None]
) -> None:
    """The object at `path` and its events: dumped whole (json, yaml), or `show`n, then the events."""
    item = client.call("GET", path)
    events = _object_events(client, kind, name, item)
    if output not in TABLE_OUTPUTS:
        _dump({**item, "events": events}, output)
        return
    show(item)
    out.print(f"UID:      {item['metadata'].get('uid') or '-'}")
    _print_events(events, output)


def _describe_job(path: str, client: Client, output: str) -> None:
    from finesched.commands.job_views import print_job

    item = client.call("GET", path)
    if output not in TABLE_OUTPUTS:
        _dump(item, output)
        return
    print_job(out, item, output == "wide")


def delete(
    what: Annotated[str, typer.Argument(help="workload, job, node, tenant, priorityclass or topology")],
    name: Annotated[str | None, typer.Argument(help="NAME (workloads: NAME or NAMESPACE/NAME)")] = None,
    server: ServerOption = DEFAULT_SERVER,
    token: TokenOption = "",
    ca: CaOption = None,
    insecure: InsecureOption = False,
    namespace: NamespaceOption = None,
    every: Annotated[bool, typer.Option("--all", help="Workloads: every workload of the namespace.")] = False,
    selector: Annotated[
        str | None, typer.Option("-l", "--selector", help="Workloads: those whose labels match, e.g. app=web,tier!=db.")
    ] = None,
) -> None:
    """Delete a workload (its binding is released), a job (all its slots at once), a node (its
    workloads are requeued), a tenant (refused while workloads, child tenants or open offers
    refer to it), a priority class (workloads admitted under it keep their priority) or a topology
    (gangs placed under it stay; gangs waiting on it wait until it exists again).
    `delete workloads -n NS --all` or `-l SELECTOR` deletes many workloads at once (a job's slots go
    with their job)."""
    kind = kind_of(what)
    many = every or selector is not None
    if many and (kind != "workloads" or name is not None):
        _fail("--all and -l delete workloads by namespace: `delete workloads -n NS --all` (no NAME)", code=2)
    if not many and name is None:
        hint = " (or --all, or -l SELECTOR)" if kind == "workloads" else ""
        _fail(f"delete {what}: give a NAME{hint}", code=2)
    if kind is None or kind == "events":
        _fail(f"delete {what!r}: use workload, job, node, tenant, priorityclass or topology", code=2)
    client = Client(server, token, ca=ca, insecure=insecure)
    if many:
        namespace = client.namespace(namespace)
        params = {"namespace": namespace, **({"labelSelector": selector} if selector else {})}
        answer = client.call("DELETE", "/v1/workloads", params=params, timeout=None)
        out.print(f"{answer['deleted']} workload(s) deleted in namespace {escape(namespace)}, "
                  f"{answer['released']} released")  # fmt: skip
        return
    assert name is not None
    if kind == "jobs":
        namespace, name = client.key(name, namespace)
        answer = client.call("DELETE", f"/v1/jobs/{namespace}/{name}")
        out.print(f"job {escape(namespace)}/{escape(name)} deleted: {len(answer['slots'])} slot(s), "
                  f"{answer['released']} released")  # fmt: skip
    elif kind == "workloads":
        namespace, name = client.key(name, namespace)
        client.call("DELETE", f"/v1/workloads/{namespace}/{name}")
        out.print(f"workload {escape(namespace)}/{escape(name)} deleted")
    elif kind == "nodes":
        answer = client.call("DELETE", f"/v1/nodes/{name}")
        out.print(f"node {escape(name)} deleted; requeued {len(answer['requeued'])} workload(s)")
    elif kind == "tenants":
        client.call("DELETE", f"/v1/tenants/{name}")
        out.print(f"tenant {escape(name)} deleted")
    elif kind == "topologies":
        client.call("DELETE", f"/v1/topologies/{name}")
        out.print(f"topology {escape(name)} deleted")
    else:
        client.call("DELETE", f"/v1/priorityclasses/{name}")
        out.print(f"priorityclass {escape(name)} deleted")


def cordon(
    node: Annotated[str, typer.Argument(help="Node name")],
    server: ServerOption = DEFAULT_SERVER,
    token: TokenOption = "",
    ca: CaOption = None,
    insecure: InsecureOption = False,
    undo: Annotated[bool, typer.Option("--undo", help="Uncordon instead.")] = False,
) -> None:
    """Stop (or, with --undo, resume) placing new work on a node."""
    Client(server, token, ca=ca, insecure=insecure).call("POST", f"/v1/nodes/{node}/{'uncordon' if undo else 'cordon'}")
    out.print(f"node {escape(node)} {'uncordoned' if undo else 'cordoned'}")


def whoami(
    server: ServerOption = DEFAULT_SERVER,
    token: TokenOption = "",
    ca: CaOption = None,
    insecure: InsecureOption = False,
    output: OutputOption = "table",
) -> None:
    """Who this token is to the server: its role, its tenant or node, and the namespaces it may use (as
    `kubectl auth whoami`; GET /v1/whoami)."""
    _check_output(output)
    me = Client(server, token, ca=ca, insecure=insecure).call("GET", "/v1/whoami")
    if output not in TABLE_OUTPUTS:
        _dump(me, output)
        return
    namespaces = me.get("namespaces")
    where = "every namespace" if namespaces is None else ", ".join(namespaces) or "none"
    out.print(f"Role:       {me['role']}")
    if me.get("tenant"):
        out.print(f"Tenant:     {escape(me['tenant'])}")
    if me.get("node"):
        out.print(f"Node:       {escape(me['node'])}")
    out.print(f"Namespaces: {escape(where)}")


def watch(
    server: ServerOption = DEFAULT_SERVER,
    token: TokenOption = "",
    ca: CaOption = None,
    insecure: InsecureOption = False,
    since: Annotated[int | None, typer.Option(help="Replay events after this id.")] = None,
    count: Annotated[int | None, typer.Option(min=1, help="Stop after this many events.")] = None,
    output: OutputOption = "table",
) -> None:
    """Stream events as they happen (Server-Sent Events); resumes after `--since`."""
    _check_output(output)
    import httpx

    client = Client(server, token, timeout=None, ca=ca, insecure=insecure)
    params = {"since": since} if since is not None else {}
    seen = 0
    try:
        with client.http.stream("GET", "/v1/events/watch", params=params) as response:
            if response.status_code >= 400:
                response.read()
                _fail_response(response, client)
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[len("data: ") :])
                if output in TABLE_OUTPUTS:
                    out.print(f"{event['id']:>7} {event['time']} {event['kind']:<8} {escape(event['object'])} "
                              f"{escape(event['reason'])} {escape(event['message'])}", soft_wrap=True)  # fmt: skip
                else:
                    _dump(event, output)
                seen += 1
                if count is not None and seen >= count:
                    return
    except httpx.HTTPError as exc:
        _fail(f"watch ended: {exc}")
