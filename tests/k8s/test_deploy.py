"""deploy/: the kube-scheduler configuration, RBAC and Deployment agree with what the extender does."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from finesched.model.resources import DEVICE_RESOURCE_NAMES, canonical_name

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
#: KubeSchedulerConfiguration v1 extender fields (PROTOCOLS.md section 1).
EXTENDER_FIELDS = {
    "urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "bindVerb", "weight", "enableHTTPS",
    "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable",
}  # fmt: skip
EXTENDED_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def test_scheduler_config_sends_device_pods_to_the_extender() -> None:
    (config,) = docs("kube-scheduler-config.yaml")
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1" and config["kind"] == "KubeSchedulerConfiguration"
    (ext,) = config["extenders"]
    assert set(ext) <= EXTENDER_FIELDS
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is False and ext["weight"] > 0
    assert {ext[v] for v in ("filterVerb", "prioritizeVerb", "preemptVerb", "bindVerb")} == {
        "filter", "prioritize", "preempt", "bind"
    }  # fmt: skip
    names = [r["name"] for r in ext["managedResources"]]
    assert len(names) == len(set(names)) and all(EXTENDED_NAME.match(n) for n in names)
    assert "nvidia.com/gpu" in names and {"koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"} <= set(names)
    assert all(canonical_name(n) in DEVICE_RESOURCE_NAMES for n in names)  # each one finesched schedules
    # the Service the URL names is the one deploy/extender.yaml creates, on the port the container serves
    service = next(d for d in docs("extender.yaml") if d["kind"] == "Service")
    meta = service["metadata"]
    assert ext["urlPrefix"] == f"http://{meta['name']}.{meta['namespace']}.svc:{service['spec']['ports'][0]['port']}"


def test_rbac_is_exactly_what_the_extender_calls() -> None:
    role = next(d for d in docs("rbac.yaml") if d["kind"] == "ClusterRole")
    granted = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    read = {"get", "list", "watch"}
    expected = {("", "pods", v) for v in read | {"patch"}} | {("", "pods/binding", "create")}
    expected |= {("", "nodes", v) for v in read}
    expected |= {("scheduling.koordinator.sh", "devices", v) for v in read}
    expected |= {("topology.node.k8s.io", "noderesourcetopologies", v) for v in read}
    expected |= {("kueue.x-k8s.io", "topologies", v) for v in read}
    assert granted == expected
    account = next(d for d in docs("rbac.yaml") if d["kind"] == "ServiceAccount")["metadata"]["name"]
    deployment = next(d for d in docs("extender.yaml") if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account
    assert pod["containers"][0]["args"][:2] == ["k8s-extender", "--in-cluster"]


def test_fixture_scheduler_config_uses_the_same_fields_as_ours() -> None:
    fixture = json.loads((Path(__file__).parent / "fixtures" / "kube-scheduler-config.json").read_text())
    (theirs,) = fixture["extenders"]
    (ours,) = docs("kube-scheduler-config.yaml")[0]["extenders"]
    assert set(theirs) <= EXTENDER_FIELDS and set(theirs) == set(ours)
    assert {r["name"] for r in theirs["managedResources"]} <= {r["name"] for r in ours["managedResources"]}
