"""Where the project's own files live: computed once, here, from this file's place in the checkout.

Every module that needs a folder of the project (the demo zoo, the SAE stores, the shipped results, the
benchmark results, the docs) imports it from here, so a file that moves breaks one line and a test
(tests/unit/test_paths.py checks that each exists and that nobody else computes a root by hand).
Scripts and benchmarks run as files put the root on `sys.path` first (`sys.path.insert(0, ...)`), the one
place they may compute it.
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: app.py, analysis/, views/, ...
ANALYSIS = ROOT / "analysis"
ZOO = ANALYSIS / "zoo"
ZOO_MODELS = ZOO / "models"  # the demo models (committed safetensors)
REAL_MODELS = ZOO / "real_models"  # real models converted from their pinned packages (not committed)
SAE_STORES = ZOO / "sae"  # the demo SAEs and their feature stores
PRECOMPUTED = ANALYSIS / "precomputed"  # results shipped with the app (`python scripts/warm.py`)
VIEWS = ROOT / "views"
APP = ROOT / "app.py"
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"  # the benchmarks' JSON results (docs read their numbers from here)
DOCS = ROOT / "docs"
SCRIPTS = ROOT / "scripts"
DEPLOY = ROOT / "deploy"
TESTS = ROOT / "tests"


def result_file(name: str) -> Path:
    """A benchmark's result file (`sae_v_filtering.json` -> benchmarks/results/sae_v_filtering.json)."""
    return RESULTS / name


def relative(path: Path) -> str:
    """`path` as the checkout names it (analysis/zoo/sae/...), for messages and logs."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)
