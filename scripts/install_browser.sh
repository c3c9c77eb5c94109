#!/usr/bin/env bash
# Debian's Chromium for the real-browser tests (Playwright drives it; no browser download).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
  echo "chromium is not installed and cannot be installed here; browser tests will be skipped" >&2
fi
