#!/usr/bin/env bash
# Install into .venv (scripts/install.sh, as the Dockerfile does) and start the app on the demo zoo.
#   bash scripts/run_app.sh [streamlit options]
#   MODEL_INSPECTOR_CONFIG=deploy/public.toml bash scripts/run_app.sh    # as a public instance (docs/deploy.md)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
exec .venv/bin/python scripts/serve.py "$@"   # streamlit run app.py, heavy imports done before it listens
