"""The console in a real browser (headless chromium): sign in, the node page drawn exactly as the API
says, tenants kept apart, what-if answers the scheduler then keeps, bad manifests shown by field
path, and pages that follow the event watch without a reload. One small cluster for all of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from defrag_cluster import WHOLE_GPU, fragmented
from manifests import node, topology, workload
from server_harness import Api, add_topology, create_tenants, inprocess_server

from finesched.cpuset import CPUSet
from finesched.model.topology import BLOCK_LABEL, HOSTNAME_LABEL, RACK_LABEL
from finesched.server.api.auth import create_token
from finesched.server.loop.loop import LoopConfig

TIMEOUT_MS = 15_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Iterator[Api]:
    """n1: 4 cores x 2 threads and 2 GPUs; team-a's LSE db and team-b's GPU share on it."""
    db = f"sqlite:///{tmp_path_factory.mktemp('console') / 'console.db'}"
    with inprocess_server(db, LoopConfig(idle_wait_s=0.05)) as api:
        api.admin.post("/v1/nodes", json=node("n1", cores=4, gpus=2))
        api.admin.post("/v1/nodes", json=node("n2", cpu="4"))
        amounts = {"cpu": "2", "memory": "1Gi"}
        share = {"cpu": "1", "gpu-core": 50, "gpu-memory-ratio": 50}
        api.admin.post("/v1/workloads", json=[workload("db", requests=amounts, limits=amounts, qos="LSE"),
                                              workload("infer", namespace="team-b", requests=share)])  # fmt: skip
        api.wait_phase("team-a/db", ("Bound",))
        api.wait_phase("team-b/infer", ("Bound",))
        yield api


class Console:
    """One signed-in browser page, collecting every page error and console error (CSP violations too)."""

    def __init__(self, browser: Any, api: Api | SimpleNamespace, token: str):
        self.api = api
        self.context = browser.new_context(viewport={"width": 1300, "height": 900})
        self.page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", self._console)
        self.page.goto(f"{api.base}/ui/workloads")  # not signed in: sent to sign in, then back
        self.page.wait_for_url("**/ui/signin?next=*")
        self.page.fill("#token", token)
        self.page.click("#signin button[type=submit]")
        self.page.wait_for_url(f"{api.base}/ui/workloads")

    def _console(self, message: Any) -> None:
        # A refused request is logged by chromium ("Failed to load resource: ... 403"): that is the API
        # answering, which the tests check themselves; anything else logged as an error is a failure.
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            self.errors.append(message.text)

    def open(self, path: str) -> Any:
        self.page.goto(f"{self.api.base}{path}")
        self.page.locator("body[data-rendered]").wait_for(state="attached")
        return self.page

    def close(self) -> None:
        self.context.close()
        assert not self.errors, self.errors


@pytest.fixture(scope="module")
def admin(browser: Any, cluster: Api) -> Iterator[Console]:
    console = Console(browser, cluster, cluster.token("admin"))
    yield console
    console.close()


def test_sign_in_refuses_an_unknown_token(browser: Any, cluster: Api) -> None:
    page = browser.new_page()
    page.goto(f"{cluster.base}/ui/signin")
    page.fill("#token", "fs_not-a-token")
    page.click("#signin button[type=submit]")
    page.locator("#signin-message .error").wait_for()
    assert "unknown token" in page.inner_text("#signin-message") and page.url.endswith("/ui/signin")
    page.close()


def test_node_page_draws_what_the_api_says(admin: Console, cluster: Api) -> None:
    page = admin.open("/ui/nodes/n1")
    spec = cluster.admin.get("/v1/nodes/n1").json()["spec"]
    bindings = cluster.admin.get("/v1/bindings", params={"node": "n1"}).json()["items"]
    for device in spec["devices"]:
        bar = page.locator(f'[data-device="gpu-{device["minor"]}"] svg[data-dim="gpu-core"]')
        assert int(bar.get_attribute("data-total")) == int(device["resources"]["gpu-core"])
        drawn = {(r.get_attribute("data-workload"), int(r.get_attribute("data-amount")))
                 for r in bar.locator("rect.held").all()}  # fmt: skip
        granted = {(b["workload"], int(g["resources"]["gpu-core"]))
                   for b in bindings for g in b["devices"].get("gpu", []) if g["minor"] == device["minor"]}  # fmt: skip
        assert drawn == granted, device["minor"]
        free = (
            int(bar.locator("rect.free").get_attribute("data-amount") or 0) if bar.locator("rect.free").count() else 0
        )
        assert free == int(device["resources"]["gpu-core"]) - sum(a for _, a in granted)
    cells = page.locator("[data-cpu]")
    assert cells.count() == len(spec["cpuTopology"]["cpus"])
    for binding in bindings:
        held = {int(c.get_attribute("data-cpu")) for c in page.locator(f'[data-holder="{binding["workload"]}"]').all()}
        assert held == set(CPUSet.parse(binding["cpuset"])), binding["workload"]
        pools = {c.get_attribute("data-pool") for c in page.locator(f'[data-holder="{binding["workload"]}"]').all()}
        assert pools <= ({"LSE"} if held else set())
    assert page.locator('[data-pool="LS"]').count() == cells.count() - 2  # db's 2 exclusive CPUs


def test_tenant_sees_only_its_own_workloads(browser: Any, cluster: Api) -> None:
    team_b = Console(browser, cluster, cluster.token("tenant", tenant="team-b"))
    page = team_b.open("/ui/workloads")
    assert (
        page.locator("tr[data-workload]").all_inner_texts() and page.locator('tr[data-workload="team-b/infer"]').count()
    )
    assert page.locator('tr[data-workload="team-a/db"]').count() == 0
    page = team_b.open("/ui/nodes/n1")  # the node, with team-a's CPUs shown as held, nameless
    assert page.locator('[data-pool="LSE"]').count() == 2
    assert page.locator('[data-pool="LSE"][data-holder=""]').count() == 2
    assert "team-a/db" not in page.content()
    page = team_b.open("/ui/workloads/team-a/db")  # refused as the API refuses it: nothing of it shown
    refused = page.inner_text("#banner .error")  # the API's 403, the same whether team-a/db exists or not
    assert "does not belong to tenant team-b" in refused and page.locator("#binding-cpuset").count() == 0
    team_b.close()


def test_invalid_manifest_shows_the_field_path(admin: Console) -> None:
    page = admin.open("/ui/plan")
    text = yaml.safe_dump_all([workload("fine"), workload("broken", cpu="lots")])
    page.fill("#plan-yaml", text)
    page.click("#plan-run")
    error = page.locator('#plan-errors [data-path="spec.requests.cpu"]')
    error.wait_for()
    line = 1 + text.splitlines().index("    cpu: lots")  # the field's own line, not its document's first
    assert f"document 2, line {line}:" in error.inner_text() and "lots" in error.inner_text()


def test_what_if_answer_is_what_the_scheduler_then_does(admin: Console, cluster: Api) -> None:
    amounts = {"cpu": "2", "memory": "1Gi"}
    planned = [
        workload("lse-2", requests=amounts, limits=amounts, qos="LSE"),
        workload("half", requests={"cpu": "1", "gpu-core": 50, "gpu-memory-ratio": 50}),
    ]
    page = admin.open("/ui/plan")
    page.fill("#plan-yaml", yaml.safe_dump_all(planned))
    page.click("#plan-run")
    page.locator("table.plan-results").wait_for()
    answer = {}
    for key in ("team-a/lse-2", "team-a/half"):
        row = page.locator(f'tr[data-workload="{key}"]')
        cpuset = row.locator("code.cpuset")
        grants = [g.get_attribute("data-device") for g in row.locator(".grant").all()]
        answer[key] = (row.get_attribute("data-node"), cpuset.inner_text() if cpuset.count() else "", grants)
    assert answer["team-a/lse-2"][1] and answer["team-a/half"][2]
    assert cluster.admin.post("/v1/workloads", json=planned).status_code == 201
    for key, (node_name, cpuset, grants) in answer.items():
        binding = cluster.wait_phase(key, ("Bound",))["status"]["binding"]
        devices = [f"{kind}-{g['minor']}" for kind, gs in binding["devices"].items() for g in gs]
        assert (binding["node"], binding["cpuset"], devices) == (node_name, cpuset, grants), key


def test_what_if_defragment_lists_the_moves(browser: Any, tmp_path: Path) -> None:
    # A whole GPU beside two cards 30 % used: "Defragment" answers the move that frees one, none made;
    # team-a's console shows team-b's mover without its name.
    with inprocess_server(f"sqlite:///{tmp_path / 'defrag.db'}", LoopConfig(idle_wait_s=0.05)) as api:
        fragmented(api)
        mover_before = api.admin.get("/v1/workloads/team-b/mover").json()
        for token, shown in ((api.token("admin"), "team-b/mover"), (api.token("tenant", tenant="team-a"), "")):
            console = Console(browser, api, token)
            page = console.open("/ui/plan")
            page.fill("#plan-yaml", yaml.safe_dump(workload("big", requests=WHOLE_GPU)))
            page.click("#plan-run")
            page.locator("table.plan-results").wait_for()
            row = page.locator('tr[data-workload="team-a/big"]')
            assert row.get_attribute("data-node") == "" and row.locator(".move").count() == 0  # not asked
            page.check("#plan-defragment")
            page.click("#plan-run")
            page.locator('tr[data-workload="team-a/big"][data-node="n1"]').wait_for()
            (move,) = row.locator(".move").all()
            assert move.get_attribute("data-mover") == shown
            text = move.inner_text()
            assert text.startswith(shown or "a workload of another tenant") and text.count("n1 (gpu ") == 2, text
            assert "30% core" in text and "maxMovesPerPlan 4" in page.locator("#plan-defrag-settings").inner_text()
            if not shown:
                assert "mover" not in page.locator("#plan-answer").inner_text()
            console.close()
        assert api.admin.get("/v1/workloads/team-b/mover").json() == mover_before  # nothing moved


def test_pages_follow_the_event_watch_without_reloading(admin: Console, cluster: Api) -> None:
    page = admin.open("/ui/workloads")
    page.locator('body[data-live="live"]').wait_for(state="attached")
    page.evaluate("() => { window.notReloaded = true; }")
    assert page.locator('tr[data-workload="team-a/late"]').count() == 0
    cluster.admin.post("/v1/workloads", json=workload("late", cpu="1"))
    row = page.locator('tr[data-workload="team-a/late"]')
    row.wait_for()
    page.locator('tr[data-workload="team-a/late"] .phase-bound').wait_for()  # and then its binding
    assert page.evaluate("() => window.notReloaded === true")
    node_page = admin.open("/ui/nodes/n2")
    page.locator('body[data-live="live"]').wait_for(state="attached")
    assert node_page.locator("table.node-workloads").count() == 0 or "team-a/late2" not in node_page.content()
    cluster.admin.post("/v1/workloads", json=workload("late2", cpu="1", nodeSelector={"finesched.io/hostname": "n2"}))
    node_page.locator('table.node-workloads a[href="/ui/workloads/team-a/late2"]').wait_for()


def test_workload_page_tails_its_output_from_the_node_agent(browser: Any, tmp_path: Path) -> None:
    # A real node agent runs the workload and serves its output; the server relays the tail.
    from agent_cluster import Cluster, phase_is

    from reachable import SYSTEM_PYTHON  # the workload runs as its tenant's user: a system program

    cluster = Cluster(tmp_path)
    try:
        agent = cluster.agent(logs=True)
        agent.tick_report()  # the report carries the agent's logs URL
        lines = "for i in range(1, 301):\n    print(f'line {i}', flush=True)\n"
        cluster.submit("printer", [SYSTEM_PYTHON, "-c", lines], {"cpu": "100m"})
        cluster.until(agent, "printer", phase_is("Succeeded"), "to finish")
        console = Console(browser, SimpleNamespace(base=cluster.url), create_token(cluster.store, "admin"))
        page = console.open("/ui/workloads/t/printer")
        shown = page.inner_text("#workload-logs").splitlines()
        assert shown[0] == "line 101" and shown[-1] == "line 300" and len(shown) == 200  # the last 200 lines
        console.close()
    finally:
        cluster.close()


def test_job_page_shows_regions_groups_and_slots(admin: Console, cluster: Api) -> None:
    job = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "jobs" / "two-regions.yaml").read_text())
    job["metadata"]["namespace"] = "demo"  # the example's job, in a tenant's namespace
    create_tenants(cluster.admin, ("demo",))  # the tenant that owns the job's namespace
    assert cluster.admin.post("/v1/jobs", json=job).status_code == 201
    page = admin.open("/ui/jobs/demo/clicks")
    regions = page.locator("table.regions tbody tr")
    assert regions.count() == 3  # a row per slot: 2 in the clicks region, 1 in the orders region
    served = cluster.admin.get("/v1/jobs/demo/clicks").json()["status"]["regions"]
    shown = {a.inner_text() for a in page.locator("table.regions a[href^='/ui/workloads/']").all()}
    assert shown == {slot["workload"] for region in served for slot in region["slots"]}
    assert page.locator("table.groups tbody tr").count() == 2  # one slot sharing group per region
    listed = admin.open("/ui/jobs")
    assert listed.locator("table.jobs a[href='/ui/jobs/demo/clicks']").count() == 1


def test_node_map_grouped_by_rack_shows_each_racks_free_capacity(browser: Any, tmp_path: Path) -> None:
    # Two racks of one block, two nodes each with 2 GPUs; the map grouped by rack, then a binding.
    with inprocess_server(f"sqlite:///{tmp_path / 'racks.db'}", LoopConfig(idle_wait_s=0.05)) as api:
        for name, rack in (("a1", "r1"), ("a2", "r1"), ("b1n", "r2"), ("b2n", "r2")):
            labels = {BLOCK_LABEL: "b1", RACK_LABEL: rack, HOSTNAME_LABEL: name}
            api.admin.post("/v1/nodes", json=node(name, gpus=2, **labels))
        add_topology(api, topology("dc", BLOCK_LABEL, RACK_LABEL, HOSTNAME_LABEL))
        console = Console(browser, api, api.token("admin"))
        page = console.open("/ui")
        page.select_option("#map-group", label=f"dc: {RACK_LABEL}")
        racks = page.locator("#node-domains [data-domain]")
        racks.first.wait_for()
        assert [r.get_attribute("data-domain") for r in racks.all()] == ["b1/r1", "b1/r2"]  # no "outside" box
        assert [r.get_attribute("data-nodes") for r in racks.all()] == ["2", "2"]

        def free(rack: str, resource: str) -> Any:
            return page.locator(f'[data-domain="b1/{rack}"] [data-resource="{resource}"] .free')

        for rack in ("r1", "r2"):
            assert free(rack, "gpu-core").inner_text() == "4 free of 4"
            assert free(rack, "cpu").inner_text() == "16 free of 16"
            assert free(rack, "memory").inner_text() == "64Gi free of 64Gi"
        # Half a GPU, 2 cpu and 1Gi bound on b1n: rack r2's free figures follow without a reload.
        page.locator('body[data-live="live"]').wait_for(state="attached")
        page.evaluate("() => { window.notReloaded = true; }")
        half = {"cpu": "2", "memory": "1Gi", "gpu-core": 50, "gpu-memory-ratio": 50}
        api.admin.post("/v1/workloads", json=workload("infer", requests=half, nodeSelector={HOSTNAME_LABEL: "b1n"}))
        api.wait_phase("team-a/infer", ("Bound",))
        page.locator('[data-domain="b1/r2"] [data-resource="gpu-core"] .free', has_text="3.5 free of 4").wait_for()
        assert (
            free("r2", "cpu").inner_text() == "14 free of 16"
            and free("r2", "memory").inner_text() == "63Gi free of 64Gi"
        )
        assert free("r1", "gpu-core").inner_text() == "4 free of 4"
        assert page.evaluate("() => window.notReloaded === true")
        # The choice is in the address: a reload shows the same grouping.
        page.reload()
        page.locator('[data-domain="b1/r2"] [data-resource="gpu-core"] .free', has_text="3.5 free of 4").wait_for()
        assert page.locator("#map-group").input_value() != ""
        console.close()
