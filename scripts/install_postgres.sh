#!/usr/bin/env bash
# Debian's PostgreSQL server, for the shared-store tests (tests/service/test_store_backends.py,
# tests/browser/test_public_instance.py start a private one on the loopback with scripts/local_postgres.py).
set -euo pipefail
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  # the package's own cluster is not needed (the tests start theirs): stop it if the package started it
  if command -v pg_ctlcluster >/dev/null 2>&1; then
    for cluster in /etc/postgresql/*/main; do
      [ -d "$cluster" ] && pg_ctlcluster "$(basename "$(dirname "$cluster")")" main stop >/dev/null 2>&1 || true
    done
  fi
else
  echo "PostgreSQL is not installed and cannot be installed here; the PostgreSQL store tests will be skipped" >&2
fi
