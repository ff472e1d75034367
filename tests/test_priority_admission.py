"""PriorityClass admission (finesched.admission.priority): resolution, the global default, and the
tenant rule, as tables and as a property; `finesched validate` and `finesched plan` on files.

The HTTP side (403s through every door, events, anonymity) is tests/server/test_priority_api.py."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from finesched.admission import NotAllowed, World, admit_job, admit_manifests, admit_priority_class, admit_workload
from finesched.admission.priority import allowed_classes, priority_limit
from finesched.cli import app
from finesched.errors import ValidationError
from finesched.model import Job, Tenant, Workload, load_manifests
from finesched.model.priority_class import PriorityClass
from finesched.model.workload import MAX_PRIORITY, MIN_PRIORITY

API = "finesched.io/v1alpha1"
CLASSES = {
    "low": PriorityClass(name="low", value=-10),
    "standard": PriorityClass(name="standard", value=100, global_default=True),
    "high": PriorityClass(name="high", value=1000),
    "polite": PriorityClass(name="polite", value=5000, preemption_policy="Never"),
}
TENANTS = {
    "alpha": Tenant(name="alpha", priority_classes=("high", "low")),
    "beta": Tenant(name="beta"),  # lists none: the global default only
}
WORLD = World(TENANTS, frozenset(), CLASSES)
NO_DEFAULT = World(TENANTS, frozenset(), {k: v for k, v in CLASSES.items() if k != "standard"})
runner = CliRunner(env={"COLUMNS": "250"})


def workload(**fields: object) -> Workload:
    return Workload.model_validate({"name": "w", "namespace": "alpha", **fields})


def problems(exc: pytest.ExceptionInfo[ValidationError]) -> dict[str, str]:
    return {e.path: e.message for e in exc.value.errors}


# Resolution (any caller) --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "world", "priority", "policy", "cls"),
    [
        pytest.param({"priorityClassName": "high"}, WORLD, 1000, "PreemptLowerPriority", "high", id="class"),
        pytest.param({"priorityClassName": "polite"}, WORLD, 5000, "Never", "polite", id="class-policy"),
        pytest.param({"priorityClassName": "high", "priority": 1000}, WORLD, 1000, "PreemptLowerPriority", "high",
                     id="class-and-same-value"),
        pytest.param({"priorityClassName": "high", "preemptionPolicy": "Never"}, WORLD, 1000, "Never", "high",
                     id="class-and-never"),
        pytest.param({}, WORLD, 100, "PreemptLowerPriority", "standard", id="default-class"),
        pytest.param({"preemptionPolicy": "Never"}, WORLD, 100, "Never", "standard", id="default-class-never"),
        pytest.param({"priority": 7}, WORLD, 7, "PreemptLowerPriority", None, id="raw-no-default"),
        pytest.param({}, NO_DEFAULT, 0, "PreemptLowerPriority", None, id="nothing"),
    ],
)  # fmt: skip
def test_a_class_resolves_to_its_value_and_policy(
    fields: dict, world: World, priority: int, policy: str, cls: str | None
) -> None:
    admitted = admit_workload(workload(**fields), world)
    assert (admitted.priority, admitted.preemption_policy, admitted.priority_class_name) == (priority, policy, cls)
    assert admit_workload(admitted, world) == admitted  # the stored form is admitted as it is


@pytest.mark.parametrize(
    ("fields", "path", "words"),
    [
        pytest.param({"priorityClassName": "nope"}, "spec.priorityClassName",
                     "no PriorityClass nope exists (known: high, low, polite, standard)", id="unknown"),
        pytest.param({"priorityClassName": "high", "priority": 5}, "spec.priority",
                     "the integer value of priority (5) must not be provided; it is computed from PriorityClass high "
                     "(1000)", id="raw-differs"),
        pytest.param({"priorityClassName": "high", "priority": 0}, "spec.priority", "must not be provided",
                     id="raw-zero-differs"),
        pytest.param({"priorityClassName": "polite", "preemptionPolicy": "PreemptLowerPriority"},
                     "spec.preemptionPolicy", "PriorityClass polite says Never", id="policy-escalates"),
    ],
)  # fmt: skip
def test_inconsistent_priorities_are_refused_at_their_field(fields: dict, path: str, words: str) -> None:
    with pytest.raises(ValidationError) as exc:
        admit_workload(workload(**fields), WORLD)
    assert words in problems(exc)[path]


def test_at_most_one_global_default() -> None:
    second = PriorityClass(name="other", value=1, global_default=True)
    with pytest.raises(ValidationError) as exc:
        admit_priority_class(second, WORLD)
    assert problems(exc) == {
        "spec.globalDefault": "PriorityClass standard is already the global default; at most one class may be"
    }
    assert admit_priority_class(CLASSES["standard"].model_copy(update={"value": 5}), WORLD).value == 5  # itself
    assert admit_priority_class(second, NO_DEFAULT) == second
    with pytest.raises(pydantic.ValidationError):
        PriorityClass.model_validate({"name": "x", "value": MAX_PRIORITY + 1})


# The tenant rule ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("namespace", "fields", "outcome"),
    [
        pytest.param("alpha", {"priorityClassName": "high"}, 1000, id="listed"),
        pytest.param("alpha", {"priorityClassName": "standard"}, 100, id="global-default-always"),
        pytest.param("alpha", {}, 100, id="nothing-named"),
        pytest.param("alpha", {"priority": 1000}, 1000, id="raw-at-limit"),
        pytest.param("alpha", {"priority": -50}, -50, id="raw-below"),
        pytest.param("alpha", {"priorityClassName": "polite"},
                     "spec.priorityClassName: tenant alpha may not use PriorityClass polite (it may use: high, low, "
                     "standard)", id="unlisted"),
        pytest.param("alpha", {"priority": 1001},
                     "spec.priority: is above the highest priority tenant alpha may set, 1000 (the highest value of "
                     "the PriorityClasses it may use: high, low, standard); name a PriorityClass instead",
                     id="raw-above"),
        pytest.param("beta", {"priority": 100}, 100, id="default-only-limit"),
        pytest.param("beta", {"priority": 2_000_000_000}, "above the highest priority tenant beta may set, 100",
                     id="issue-25-attack"),
        pytest.param("beta", {"priorityClassName": "nope"}, "may not use PriorityClass nope (it may use: standard)",
                     id="unknown-and-unlisted"),
    ],
)  # fmt: skip
def test_a_tenant_uses_only_its_classes(namespace: str, fields: dict, outcome: int | str) -> None:
    asked = workload(namespace=namespace, **fields)
    if isinstance(outcome, int):
        assert admit_workload(asked, WORLD, as_tenant=True).priority == outcome
        return
    with pytest.raises(NotAllowed) as exc:
        admit_workload(asked, WORLD, as_tenant=True)
    assert outcome in str(exc.value)
    if fields.get("priorityClassName") != "nope":  # an admin (not as_tenant) may ask for any valid priority
        name = fields.get("priorityClassName")
        assert admit_workload(asked, WORLD).priority == (CLASSES[name].value if name else asked.priority)


def test_the_limit_is_zero_without_classes_and_a_listed_class_that_does_not_exist_is_no_right() -> None:
    world = World({"gamma": Tenant(name="gamma", priority_classes=("future",))}, frozenset(), {})
    assert priority_limit(world.tenant("gamma"), {}) == 0
    assert admit_workload(workload(namespace="gamma"), world, as_tenant=True).priority == 0
    with pytest.raises(NotAllowed, match=r"tenant gamma may set, 0 \(it may use no PriorityClass\)"):
        admit_workload(workload(namespace="gamma", priority=1), world, as_tenant=True)
    with pytest.raises(ValidationError) as exc:  # listed, so allowed to name; but it does not exist (yet)
        admit_workload(workload(namespace="gamma", priorityClassName="future"), world, as_tenant=True)
    assert "no PriorityClass future exists" in problems(exc)["spec.priorityClassName"]


def test_the_tenant_rule_comes_before_other_problems() -> None:
    bad_and_forbidden = workload(priorityClassName="polite", requests={"koordinator.sh/gpu-core": 50})
    with pytest.raises(NotAllowed):
        admit_workload(bad_and_forbidden, WORLD, as_tenant=True)
    with pytest.raises(ValidationError):
        admit_workload(bad_and_forbidden, WORLD)


def test_a_jobs_slots_take_its_class_and_the_tenant_rule() -> None:
    def job(**fields: object) -> Job:
        return Job.model_validate({"name": "etl", "namespace": "alpha", "tasks": [
            {"id": "t", "parallelism": 2, "operators": [{"id": "o"}]}], **fields})  # fmt: skip

    _, slots = admit_job(job(priorityClassName="high"), WORLD, as_tenant=True)
    assert {(w.priority, w.priority_class_name) for w in slots} == {(1000, "high")}
    _, slots = admit_job(job(), WORLD, as_tenant=True)
    assert {w.priority_class_name for w in slots} == {"standard"}
    with pytest.raises(NotAllowed, match="may not use PriorityClass polite"):
        admit_job(job(priorityClassName="polite"), WORLD, as_tenant=True)


@given(
    values=st.lists(st.integers(MIN_PRIORITY, MAX_PRIORITY), min_size=0, max_size=4),
    default=st.none() | st.integers(0, 3),
    listed=st.sets(st.integers(0, 5)),
    priority=st.integers(MIN_PRIORITY, MAX_PRIORITY),
    named=st.none() | st.integers(0, 5),
)
def test_a_tenants_workload_never_gets_more_than_its_limit(
    values: list[int], default: int | None, listed: set[int], priority: int, named: int | None
) -> None:
    """Whatever the classes, the tenant's list and the workload ask, what a tenant's token gets
    admitted has a priority at most the tenant's limit, and a named class is one it may use."""
    classes = {f"c{i}": PriorityClass(name=f"c{i}", value=v, global_default=i == default) for i, v in enumerate(values)}
    tenant = Tenant(name="t", priority_classes=tuple(f"c{i}" for i in sorted(listed)))
    world = World({"t": tenant}, frozenset(), classes)
    fields: dict = {"priority": priority} if named is None else {"priorityClassName": f"c{named}"}
    try:
        admitted = admit_workload(Workload.model_validate({"name": "w", "namespace": "t", **fields}), world,
                                  as_tenant=True)  # fmt: skip
    except (NotAllowed, ValidationError):
        return
    assert admitted.priority <= priority_limit(tenant, classes)
    if admitted.priority_class_name is not None:
        assert admitted.priority_class_name in allowed_classes(tenant, classes)
        assert admitted.priority == classes[admitted.priority_class_name].value


# Files: validate and plan -------------------------------------------------------------------------------
def _files(tmp_path: Path) -> tuple[Path, Path]:
    classes = tmp_path / "classes.yaml"
    classes.write_text(
        f"apiVersion: {API}\nkind: PriorityClass\nmetadata: {{name: high}}\nspec: {{value: 1000}}\n---\n"
        f"apiVersion: {API}\nkind: PriorityClass\nmetadata: {{name: base}}\nspec: {{value: 5, globalDefault: true}}\n"
    )
    work = tmp_path / "work.yaml"
    work.write_text(
        f"apiVersion: {API}\nkind: Workload\nmetadata: {{name: a, namespace: default}}\n"
        "spec: {priorityClassName: high}\n---\n"
        f"apiVersion: {API}\nkind: Workload\nmetadata: {{name: b, namespace: default}}\n"
    )
    return classes, work


def test_validate_resolves_classes_from_the_files(tmp_path: Path) -> None:
    classes, work = _files(tmp_path)
    admitted, warnings = admit_manifests(load_manifests(classes, work))
    assert [(w.name, w.priority, w.priority_class_name) for w in admitted.workloads] == [
        ("a", 1000, "high"), ("b", 5, "base")]  # fmt: skip
    assert warnings == [] and [c.name for c in admitted.priority_classes] == ["high", "base"]
    alone = runner.invoke(app, ["validate", str(work)])  # the classes are the server's: a warning
    assert alone.exit_code == 0 and "spec.priorityClassName" in alone.stderr and "no PriorityClass high" in alone.stderr
    both = runner.invoke(app, ["validate", str(classes), str(work)])
    assert both.exit_code == 0 and "priority 1000 (high)" in both.stdout and "warning" not in both.stderr
    twice = tmp_path / "twice.yaml"
    twice.write_text(f"apiVersion: {API}\nkind: PriorityClass\nmetadata: {{name: other}}\n"
                     "spec: {value: 1, globalDefault: true}\n")  # fmt: skip
    refused = runner.invoke(app, ["validate", str(classes), str(twice)])
    assert refused.exit_code == 1 and "spec.globalDefault" in refused.stderr and "PriorityClass base" in refused.stderr
    tenant = tmp_path / "tenant.yaml"
    tenant.write_text(f"apiVersion: {API}\nkind: Tenant\nmetadata: {{name: t}}\nspec: {{priorityClasses: [gone]}}\n")
    warned = runner.invoke(app, ["validate", str(classes), str(tenant)])
    assert (
        warned.exit_code == 0
        and "spec.priorityClasses[0]" in warned.stderr
        and "no PriorityClass gone" in warned.stderr
    )


def test_plan_resolves_classes_from_the_files(tmp_path: Path) -> None:
    classes, work = _files(tmp_path)
    node = tmp_path / "node.yaml"
    node.write_text(f"apiVersion: {API}\nkind: Node\nmetadata: {{name: n}}\nspec: {{allocatable: {{cpu: '1'}}}}\n")
    hog = tmp_path / "hog.yaml"  # wave 1 fills the node at the default class's 5; wave 2's "high" preempts it
    hog.write_text(f"apiVersion: {API}\nkind: Workload\nmetadata: {{name: hog, namespace: default}}\n"
                   "spec: {requests: {cpu: '1'}}\n")  # fmt: skip
    urgent = tmp_path / "urgent.yaml"
    urgent.write_text(f"apiVersion: {API}\nkind: Workload\nmetadata: {{name: urgent, namespace: default}}\n"
                      "spec: {priorityClassName: high, requests: {cpu: '1'}}\n")  # fmt: skip
    result = runner.invoke(app, ["plan", "-o", "json", "--waves", str(node), str(classes), str(hog), str(urgent)])
    assert result.exit_code == 0, result.output
    assert '"reason": "priority 5 < 1000"' in result.stdout and '"preemptor": "default/urgent"' in result.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"apiVersion: {API}\nkind: Workload\nmetadata: {{name: bad, namespace: default}}\n"
                   "spec: {priorityClassName: high, priority: 3}\n")  # fmt: skip
    refused = runner.invoke(app, ["plan", str(classes), str(bad)])
    assert refused.exit_code == 1 and "must not be provided" in refused.stderr
    server = runner.invoke(app, ["plan", "--server", "http://127.0.0.1:1", str(classes), str(work)])
    assert server.exit_code == 1 and "PriorityClass high" in server.stderr
