#!/usr/bin/env bash
# The PostgreSQL server binaries the state-store tests start a private cluster with
# (tests/support/postgres.py): Debian's postgresql package, installed when initdb is missing.
set -euo pipefail
if command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    echo "postgres stage: server binaries present"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq postgresql >/dev/null
# the package starts a cluster of its own on 5432; the tests need only the binaries
if command -v pg_ctlcluster >/dev/null 2>&1; then
    for conf in /etc/postgresql/*/main; do
        [ -d "$conf" ] && pg_ctlcluster "$(basename "$(dirname "$conf")")" main stop || true
    done
fi
ls /usr/lib/postgresql/*/bin/initdb
