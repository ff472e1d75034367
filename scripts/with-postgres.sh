#!/usr/bin/env bash
# Run a command with a throwaway PostgreSQL server on 127.0.0.1 (Debian's postgresql, installed if
# missing), exporting FINESCHED_TEST_PG_URL for the store and API tests; the server is stopped and
# its files removed when the command ends. Needs root (to install, and to run the server as the
# postgres user). Usage: scripts/with-postgres.sh make test
set -euo pipefail

if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    echo "with-postgres: installing Debian's postgresql" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
pgdir=$(mktemp -d /tmp/finesched-pg.XXXXXX)
chown postgres "$pgdir"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

as_postgres() { runuser -u postgres -- "$@"; }
stop() {
    as_postgres "$pgbin/pg_ctl" -D "$pgdir/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$pgdir"
}
trap stop EXIT

as_postgres "$pgbin/initdb" -D "$pgdir/data" -A trust -U postgres --no-sync >/dev/null
as_postgres "$pgbin/pg_ctl" -D "$pgdir/data" -l "$pgdir/server.log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $pgdir -c max_connections=300" start >/dev/null
echo "with-postgres: PostgreSQL $("$pgbin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port" >&2

export FINESCHED_TEST_PG_URL="postgresql+psycopg://postgres@127.0.0.1:$port/postgres"
export FINESCHED_REQUIRE_PG=1
"$@"
