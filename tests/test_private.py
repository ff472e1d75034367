"""Private files: directories 0700 and files 0600 whatever the umask, wider ones tightened with a log
line, shared (sticky) directories left alone; the SQLite store and a replica's identity use them."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from finesched.private import open_private, private_dir, private_file, write_private
from finesched.server.loop.lease import replica_identity
from finesched.server.store.store import Store


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The loosest umask a user may have: nothing here may rely on it."""
    before = os.umask(0)
    try:
        yield
    finally:
        os.umask(before)


def test_new_directories_and_files_are_private_whatever_the_umask(tmp_path: Path, open_umask: None) -> None:
    assert mode(private_dir(tmp_path / "data")) == 0o700
    assert mode(private_file(tmp_path / "data" / "token")) == 0o600
    write_private(tmp_path / "data" / "secret", "s3cret\n")
    assert mode(tmp_path / "data" / "secret") == 0o600 and (tmp_path / "data" / "secret").read_text() == "s3cret\n"
    with open_private(tmp_path / "data" / "server.log") as log:
        log.write(b"line\n")
    assert mode(tmp_path / "data" / "server.log") == 0o600
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["secret", "server.log", "token"]  # no temp left


def test_existing_wide_modes_are_tightened_with_a_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o755)
    (data / "finesched.db").write_text("kept")
    (data / "finesched.db").chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="finesched.files"):
        private_dir(data)
        private_file(data / "finesched.db")
    assert mode(data) == 0o700 and mode(data / "finesched.db") == 0o600
    assert (data / "finesched.db").read_text() == "kept"  # tightened, not replaced
    assert [r.getMessage() for r in caplog.records] == [
        f"{data} was mode 755, readable by others; tightened to 700",
        f"{data / 'finesched.db'} was mode 644, readable by others; tightened to 600",
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="finesched.files"):
        private_dir(data)  # already private: nothing to say
    assert caplog.records == []


def test_a_shared_sticky_directory_is_left_open_but_files_in_it_are_private(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    private_dir(shared)
    assert mode(shared) == 0o1777  # like /tmp: tightening it would lock every other user out
    assert mode(private_file(shared / "fs.db")) == 0o600


def test_the_sqlite_store_and_its_wal_are_private(tmp_path: Path, open_umask: None) -> None:
    db = tmp_path / "new-dir" / "finesched.db"
    store = Store.open(f"sqlite:///{db}")
    try:
        store.put_tenant("team-a", 1.0, {"metadata": {"name": "team-a"}}, create_only=True)  # a write: WAL in use
        files = [p for p in db.parent.iterdir() if p.name.startswith("finesched.db")]
        assert {p.name for p in files} >= {"finesched.db", "finesched.db-wal"}
        assert {p.name: mode(p) for p in files} == dict.fromkeys((p.name for p in files), 0o600)
        assert mode(db.parent) == 0o700
    finally:
        store.close()


def test_a_store_made_by_an_older_version_is_tightened(tmp_path: Path) -> None:
    db = tmp_path / "finesched.db"
    Store.open(f"sqlite:///{db}").close()
    db.chmod(0o644)
    Store.open(f"sqlite:///{db}").close()
    assert mode(db) == 0o600


def test_a_replicas_identity_files_are_private(tmp_path: Path, open_umask: None) -> None:
    data = tmp_path / "replica"
    identity = replica_identity(data)
    assert mode(data) == 0o700
    assert {p.name: mode(p) for p in data.iterdir()} == {"replica-id": 0o600, "replica.lock": 0o600}
    assert identity.name.startswith("replica-")
