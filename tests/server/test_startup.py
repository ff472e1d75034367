"""What `finesched serve` does before it answers, checked by what it does, not by how long it takes:
a current schema is checked, not migrated (Alembic is not even imported); a request's modules do not
pull in what only other commands need; a node row becomes the same Node whether or not its whole
manifest is copied first."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from finesched.server.store import migrate
from finesched.server.store import schema as t
from finesched.server.store.cluster_view import node_from_row
from finesched.server.store.store import Store

#: Modules no request needs: a server that imports them at start pays for them on every start.
NOT_AT_START = ("alembic", "httpx", "rich", "typer", "matplotlib", "scipy", "kubernetes", "finesched.sim")


def _python(code: str) -> None:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_head_is_the_newest_migration() -> None:
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(migrate.alembic_config(sa.create_engine("sqlite://")))
    assert scripts.get_heads() == [migrate.HEAD]


def test_a_current_schema_is_checked_without_alembic(db_url: str) -> None:
    Store.open(db_url).close()  # a new database: migrated
    _python(
        "import sys\n"
        "from finesched.server.store.store import Store\n"
        "from finesched.server.store.migrate import HEAD, stored_revision\n"
        f"store = Store.open({db_url!r})\n"
        "assert 'alembic' not in sys.modules, 'a current schema imported alembic'\n"
        "assert stored_revision(store.engines.writer) == HEAD\n"
        "store.close()\n"
    )


def test_an_older_schema_is_still_migrated(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    migrate.upgrade(engine, "0004")
    assert migrate.stored_revision(engine) == "0004"
    migrate.upgrade(engine)
    assert migrate.stored_revision(engine) == migrate.current_revision(engine) == migrate.HEAD
    assert "topologies" in sa.inspect(engine).get_table_names()
    engine.dispose()


def test_a_new_database_has_no_revision(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'new.db'}")
    assert migrate.stored_revision(engine) is None
    engine.dispose()


def test_the_server_imports_nothing_a_request_does_not_need() -> None:
    _python(
        "import sys\n"
        "import finesched.server.app, finesched.server.api.http_server, finesched.server.store.store\n"
        "import finesched.server.loop.loop\n"
        f"loaded = [m for m in {NOT_AT_START!r} if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )


def test_the_command_line_imports_no_http_client_until_it_makes_a_request() -> None:
    _python("import sys\nimport finesched.cli\nassert 'httpx' not in sys.modules and 'alembic' not in sys.modules\n")


# node_from_row: copies only what it changes ------------------------------------------------------------
def _reference(row: dict[str, Any]) -> Any:
    """node_from_row as it was: the manifest deep-copied, then changed in place."""
    from finesched.model.manifest import parse_manifest
    from finesched.plugins.node_unschedulable import UNSCHEDULABLE_LABEL
    from finesched.plugins.tenant_isolation import TENANT_ISOLATION_LABEL, isolation_label
    from finesched.server.store.cluster_view import HOSTNAME_LABEL, KUBERNETES_HOSTNAME_LABEL, tenant_isolation

    doc = copy.deepcopy(row["spec"])
    metadata = doc.setdefault("metadata", {})
    labels = {KUBERNETES_HOSTNAME_LABEL: row["name"], **(metadata.get("labels") or {}), HOSTNAME_LABEL: row["name"]}
    why = "cordoned" if row.get("cordoned") else ("not-ready" if not row.get("ready", True) else "")
    if why:
        labels[UNSCHEDULABLE_LABEL] = why
    isolation = tenant_isolation(row)
    if isolation is not None:
        labels[TENANT_ISOLATION_LABEL] = isolation_label(isolation["isolated"], isolation["allowTenantSharing"])
    metadata["labels"] = labels
    health = ((row.get("report") or {}).get("health")) or {}
    for device in (doc.get("spec") or {}).get("devices") or ():
        reported = health.get(device.get("type"), {}).get(str(device.get("minor")))
        if reported is False:
            device["health"] = False
    return parse_manifest(doc, where=f"node {row['name']}")


def _outcome(build: Any, row: dict[str, Any]) -> Any:
    try:
        return build(row).model_dump()
    except Exception as exc:  # the same refusal, in the same words
        return type(exc).__name__, str(exc)


@st.composite
def node_rows(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(st.sampled_from(["n1", "n2"]))
    gpus = draw(st.integers(0, 3))
    devices = [{"type": "gpu", "minor": i, "uuid": f"GPU-{i}", "resources": {"gpu-core": 100}} for i in range(gpus)]
    spec: dict[str, Any] = {"allocatable": {"cpu": draw(st.sampled_from(["8", "16", "x"])), "memory": "32Gi"}}
    if devices:
        spec["devices"] = devices
    metadata: dict[str, Any] = {"name": name}
    if draw(st.booleans()):
        metadata["labels"] = draw(st.dictionaries(st.sampled_from(["zone", "finesched.io/hostname"]), st.just("a")))
    doc = {"apiVersion": "finesched.io/v1alpha1", "kind": "Node", "metadata": metadata, "spec": spec}
    health = {"gpu": {str(i): draw(st.booleans()) for i in range(gpus)}} if gpus and draw(st.booleans()) else None
    isolation = draw(st.sampled_from([None, {"isolated": True}, {"isolated": False, "allowTenantSharing": True}]))
    report: dict[str, Any] = {}
    if health:
        report["health"] = health
    if isolation:
        report["discovery"] = {"tenantIsolation": isolation}
    return {"name": name, "spec": doc, "cordoned": draw(st.booleans()), "ready": draw(st.booleans()),
            "report": report or None}  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(row=node_rows())
def test_a_node_row_makes_the_same_node_and_stays_as_it_was(row: dict[str, Any]) -> None:
    before = copy.deepcopy(row)
    assert _outcome(node_from_row, row) == _outcome(_reference, row)
    assert row == before  # the store's row is not changed


# Stored nodes read and validated without json.loads / json.dumps -----------------------------------------
#: JSON values as a stored row can hold them: big integers, every float (NaN and infinities are
#: written by json.dumps as NaN / Infinity), any text (a lone surrogate, NUL, line separators).
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same types (NaN equal to NaN, 1 not equal to 1.0 or True)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (a != a and b != b)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_decode_json_gives_what_json_loads_gives(value: Any) -> None:
    import json

    from finesched.server.store.store import decode_json

    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False), json.dumps(value, indent=1)):
        assert _same(decode_json(text), json.loads(text))


def test_list_nodes_reads_the_spec_the_json_column_reads(store: Store) -> None:
    """The spec read as text and decoded by decode_json is the JSON column's own value, on both backends."""
    import json

    examples: list[Any] = [
        {"a": [1, 1.0, -0.0, 1e300, 2**70, True, None], "b": {"c": 'é\u2028\x00 \\ "'}},
        {"lone": "\ud800x\udfff", "nested": [{"k": 5e-324}]},
        {"inf": float("inf"), "nan": float("nan")},
    ]
    for spec in examples:
        try:
            store.put_node("n1", spec, create_only=False)
        except Exception:  # PostgreSQL's json type refuses NaN and lone surrogates: nothing to read
            assert "nan" in spec or "lone" in spec
            continue
        with store.read() as conn:
            column = conn.execute(sa.select(t.nodes.c.spec).where(t.nodes.c.name == "n1")).scalar_one()
        (row,) = store.list_nodes()
        assert _same(row["spec"], column), (json.dumps(row["spec"]), json.dumps(column))


@st.composite
def decoded_node_docs(draw: st.DrawFn) -> dict[str, Any]:
    """A Node manifest as decoded from a stored row: valid, or with any JSON value put in one place."""
    cpus = [{"id": i, "core": i // 2, "socket": 0, "numa": 0} for i in range(draw(st.integers(1, 6)))]
    spec: dict[str, Any] = {"allocatable": {"cpu": str(len(cpus)), "memory": "8Gi"}, "cpuTopology": {"cpus": cpus}}
    doc: dict[str, Any] = {"apiVersion": "finesched.io/v1alpha1", "kind": "Node",
                           "metadata": {"name": "n1", "labels": {"zone": "a"}}, "spec": spec}  # fmt: skip
    if draw(st.booleans()):
        value = draw(json_values)
        place = draw(st.sampled_from(["label", "allocatable", "cpu-id", "cpu-field", "spec-field", "name", "topology"]))
        if place == "label":
            doc["metadata"]["labels"]["zone"] = value
        elif place == "allocatable":
            spec["allocatable"]["cpu"] = value
        elif place == "cpu-id":
            cpus[draw(st.integers(0, len(cpus) - 1))]["id"] = value
        elif place == "cpu-field":
            cpus[0][draw(st.sampled_from(["core", "socket", "numa", "extra"]))] = value
        elif place == "spec-field":
            spec[draw(st.sampled_from(["devices", "taints", "unknownField", "name"]))] = value
        elif place == "name":
            doc["metadata"]["name"] = value
        else:
            spec["cpuTopology"] = value
    return doc


@settings(max_examples=300, deadline=None)
@given(doc=decoded_node_docs())
def test_a_decoded_manifest_parses_as_parse_manifest_parses_it(doc: dict[str, Any]) -> None:
    from finesched.model.manifest import parse_decoded_manifest, parse_manifest

    assert _outcome(lambda d: parse_decoded_manifest(d, where="node n1"), doc) == _outcome(
        lambda d: parse_manifest(d, where="node n1"), doc
    )


# `finesched serve` registers only the serve command ------------------------------------------------------
_RUN_CLI = "import sys\nsys.argv = {first!r}\nimport finesched.cli as cli\nsys.argv = {then!r}\ncli.main()\n"


def _cli(first: list[str], then: list[str]) -> tuple[int, str, str]:
    code = _RUN_CLI.format(first=first, then=then)
    env = {**os.environ, "COLUMNS": "100", "TERM": "dumb"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    return done.returncode, done.stdout, done.stderr


def test_serve_imports_no_other_command() -> None:
    _python(
        "import sys\n"
        "sys.argv[1:] = ['serve', '--help']\n"
        "import finesched.cli\n"
        "others = ('finesched.sim', 'finesched.commands.client', 'finesched.commands.sim', 'finesched.commands.agent',"
        " 'finesched.commands.job', 'finesched.commands.k8s', 'finesched.commands.tokens')\n"
        "loaded = [m for m in others if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )


def test_serve_answers_as_with_every_command_registered() -> None:
    for args in (["--help"], ["--port", "x"], ["--no-such-option"]):
        alone = _cli(["finesched", "serve", *args], ["finesched", "serve", *args])
        with_all = _cli(["finesched"], ["finesched", "serve", *args])
        assert alone == with_all
        assert alone[0] in (0, 2) and (alone[1] + alone[2]).strip()
