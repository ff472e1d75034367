"""Schema migrations (Alembic) for the store: every database is brought to the newest revision on start.

A database already at the newest revision (every start but the first after an upgrade) is only
checked: its `alembic_version` row is read with one query and compared with `HEAD`, without
importing Alembic or reading the migration scripts (a third of a second of a server's start).
Alembic runs only when the database is new or older. `HEAD` is the newest script's revision; a
test checks that it is the head Alembic finds (tests/server/test_startup.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).with_name("migrations")
#: The newest migration's revision (migrations/versions/): raise it with every new migration.
HEAD = "0005"


def alembic_config(engine: Engine) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply every migration up to `revision` in one transaction (idempotent); a database already
    at `HEAD` asked for "head" is left alone after one read."""
    if revision in ("head", HEAD) and stored_revision(engine) == HEAD:
        return
    from alembic import command

    config = alembic_config(engine)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def stored_revision(engine: Engine) -> str | None:
    """The revision in the database's `alembic_version` table (None: no table, or no row, or more
    than one, as during a branch merge, which only Alembic itself judges)."""
    try:
        with engine.connect() as connection:
            rows = connection.execute(text("SELECT version_num FROM alembic_version")).all()
            connection.rollback()
    except DBAPIError:  # no such table: a new database
        return None
    return str(rows[0][0]) if len(rows) == 1 else None


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
