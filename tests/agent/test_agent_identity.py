"""Who a workload runs as (agent/identity.py): the uid range, its allocation table, runAs."""

from __future__ import annotations

import json
import logging
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from finesched.agent.binding import BindingError, parse_binding
from finesched.agent.identity import IdentityError, RunAs, TenantUids, Users, parse_uid_range, system_ids
from finesched.cli import app


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "expected START-END"),
        ("200000", "expected START-END"),
        ("a-b", "expected START-END"),
        ("-5-10", "expected START-END"),
        ("1.5-10", "expected START-END"),
        ("0-10", "START must be at least 1 (uid 0 is root)"),
        ("10-5", "START must not be above END"),
        ("1-4294967295", "END must be at most 4294967294"),
    ],
)
def test_a_bad_range_names_the_option_and_the_value(text: str, said: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_uid_range(text)
    assert str(caught.value).startswith(f"--tenant-uids {text!r}: ") and said in str(caught.value)


@pytest.mark.parametrize("command", ["agent", "up"])
def test_the_commands_refuse_a_bad_range_before_anything_starts(command: str, tmp_path: Path) -> None:
    args = ["agent", "--server", "http://127.0.0.1:9", "--token", "t"] if command == "agent" else ["up"]
    done = CliRunner().invoke(app, [*args, "--data", str(tmp_path / "d"), "--tenant-uids", "10-5"])
    assert done.exit_code == 2 and "--tenant-uids '10-5': START must not be above END" in done.output
    done = CliRunner().invoke(app, [*args, "--data", str(tmp_path / "d"), "--sandbox", "docker"])
    assert done.exit_code == 2 and "--sandbox 'docker': must be one of none, bwrap" in done.output
    assert not (tmp_path / "d").exists()


def test_ranges_parse_inclusively() -> None:
    assert parse_uid_range("200000-299999") == range(200000, 300000)
    assert parse_uid_range(" 7-7 ") == range(7, 8)


def system(tmp_path: Path, passwd_uids: list[int] = (), group_gids: list[int] = ()) -> tuple[Path, Path]:
    passwd, group = tmp_path / "passwd", tmp_path / "group"
    passwd.write_text("root:x:0:0:root:/root:/bin/sh\n" + "".join(f"u{u}:x:{u}:{u}::/:/bin/sh\n" for u in passwd_uids))
    group.write_text("root:x:0:\n" + "".join(f"g{g}:x:{g}:\n" for g in group_gids) + "broken line\n")
    return passwd, group


def test_each_tenant_gets_the_first_free_uid_skipping_accounts_and_groups(tmp_path: Path) -> None:
    passwd, group = system(tmp_path, passwd_uids=[500], group_gids=[502])
    uids = TenantUids(tmp_path, range(500, 506), passwd, group)
    assert [uids.uid_of(t) for t in ("a", "b", "a")] == [501, 503, 501]  # 500 is an account, 502 a group
    assert uids.uid_of("c", busy=[504]) == 505  # a uid some running workload still uses is not given out
    with pytest.raises(IdentityError) as caught:
        uids.uid_of("d", busy=[504])
    message = str(caught.value)
    assert "no uid left for tenant d" in message and "--tenant-uids 500-505 is used up" in message
    assert "spec.runAs" in message
    assert uids.given == {"a": 501, "b": 503, "c": 505}  # the refusal changed nothing


def test_the_table_survives_a_restart_and_is_private(tmp_path: Path) -> None:
    passwd, group = system(tmp_path)
    first = TenantUids(tmp_path, range(1000, 1010), passwd, group)
    given = {t: first.uid_of(t) for t in ("x", "y", "z")}
    path = tmp_path / "tenant-uids.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"version": 1, "range": "1000-1009", "tenants": given}
    again = TenantUids(tmp_path, range(1000, 1010), passwd, group)
    assert {t: again.uid_of(t) for t in ("z", "y", "x")} == given
    assert again.uid_of("w") == 1003


def test_a_uid_outside_a_new_range_is_given_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    passwd, group = system(tmp_path)
    TenantUids(tmp_path, range(1000, 1010), passwd, group).uid_of("x")
    with caplog.at_level(logging.WARNING, logger="finesched.agent"):
        moved = TenantUids(tmp_path, range(2000, 2010), passwd, group)
    assert "tenant x: uid 1000 is outside --tenant-uids 2000-2009 now" in caplog.text
    assert moved.uid_of("x") == 2000


@pytest.mark.parametrize("text", ["{not json", '{"version": 9, "tenants": {}}', "[]"])
def test_an_unreadable_table_stops_the_agent_with_a_clear_error(tmp_path: Path, text: str) -> None:
    (tmp_path / "tenant-uids.json").write_text(text)
    with pytest.raises(ValueError, match=r"tenant-uids\.json.*move it away"):
        TenantUids(tmp_path, range(1000, 1010))


@given(st.lists(st.sampled_from("abcdefgh"), max_size=30), st.sets(st.integers(100, 111), max_size=6))
def test_no_two_tenants_ever_share_a_uid(tmp_path_factory: pytest.TempPathFactory, asks: list[str], taken: set[int]):
    where = tmp_path_factory.mktemp("uids")
    passwd, group = system(where, passwd_uids=sorted(taken))
    uids = TenantUids(where, range(100, 112), passwd, group)
    for tenant in asks:
        try:
            uid = uids.uid_of(tenant)
        except IdentityError:
            assert len(uids.given) + len(taken) >= 12 and tenant not in uids.given
            continue
        assert uid in range(100, 112) and uid not in taken
    assert len(set(uids.given.values())) == len(uids.given)


def users(tmp_path: Path, root: bool = True) -> Users:
    passwd, group = system(tmp_path)
    return Users(TenantUids(tmp_path, range(300000, 300010), passwd, group), root, own=(1000, 1000))


def test_run_as_is_the_tenant_s_user_and_root_only_when_allowed(tmp_path: Path) -> None:
    u = users(tmp_path)
    assert (u.identity("a", RunAs(5000, 6000)).uid, u.identity("a", RunAs(5000, 6000)).gid) == (5000, 6000)
    root = u.identity("ops", RunAs(0, 0, allow_root=True))
    assert (root.uid, root.gid, root.switch) == (0, 0, True)
    with pytest.raises(IdentityError, match="names root without allowRoot"):
        u.identity("a", RunAs(0, 5))
    ranged = u.identity("b", None)
    assert (ranged.uid, ranged.gid, ranged.switch) == (300000, 300000, True) and "--tenant-uids" in ranged.source
    with pytest.raises(IdentityError, match=r"inside this node's --tenant-uids 300000-300009.*tenant b's here"):
        u.identity("c", RunAs(300000, 300000))  # would share b's files and signals
    with pytest.raises(IdentityError, match=r"runAs uid 300005 is inside .*it may be any tenant's"):
        u.identity("c", RunAs(300005, 300005))  # free now, but the range may give it to anyone


def test_an_agent_that_is_not_root_runs_everything_as_itself(tmp_path: Path) -> None:
    u = users(tmp_path, root=False)
    for run_as in (None, RunAs(5000, 5000)):
        found = u.identity("a", run_as)
        assert (found.uid, found.gid, found.switch) == (1000, 1000, False)
    report = u.report()
    assert report["isolated"] is False and "not root" in report["reason"] and report["allowTenantSharing"] is False
    assert users(tmp_path).report("bwrap")["isolated"] is True


def test_system_ids_reads_uids_and_gids(tmp_path: Path) -> None:
    passwd, group = system(tmp_path, passwd_uids=[7], group_gids=[9])
    assert system_ids(passwd, group) == {0, 7, 9}
    assert system_ids(tmp_path / "none", tmp_path / "none") == set()


@pytest.mark.parametrize(
    ("run_as", "said"),
    [
        ({"uid": "5", "gid": 5}, "runAs.uid"),
        ({"uid": 5}, "runAs.gid"),
        ({"uid": True, "gid": 5}, "runAs.uid"),
        ({"uid": 5, "gid": -1}, "runAs.gid"),
        ({"uid": 5, "gid": 5, "allowRoot": "yes"}, "runAs.allowRoot"),
        ([5, 5], "runAs: an object"),
    ],
)
def test_a_malformed_run_as_in_a_binding_names_the_field(run_as: object, said: str) -> None:
    item = {"workload": "a/w", "node": "n", "cpuset": "", "version": 1, "tenant": "a", "runAs": run_as}
    with pytest.raises(BindingError, match=said):
        parse_binding(item)


def test_a_binding_names_its_tenant_or_its_namespace_stands_for_it() -> None:
    item = {"workload": "ns/w", "node": "n", "cpuset": "", "version": 1}
    assert parse_binding(item).tenant == "ns" and parse_binding(item).run_as is None
    told = parse_binding({**item, "tenant": "team", "runAs": {"uid": 7, "gid": 8}})
    assert (told.tenant, told.run_as) == ("team", RunAs(7, 8))
