"""Project folders come from analysis/framework/paths.py alone: each one it names exists, and no other file computes
a project path from its own location (the copies drifted: the SAE page read a filtering result from a
folder that had moved)."""
from __future__ import annotations

import re
import subprocess

from analysis.framework import paths

# The one line a script or benchmark run as a file may compute: the checkout on sys.path, before it can
# import analysis.framework.paths. tests/conftest.py does the same for the suite.
BOOTSTRAP = "sys.path.insert(0, str(Path(__file__).resolve().parents[1]))"
HAND_MADE = re.compile(r"Path\(__file__\)|os\.path\.dirname\(__file__\)|__file__\)\.parent")


def test_every_named_folder_exists():
    named = {name: value for name, value in vars(paths).items() if name.isupper()}
    assert {"ROOT", "ZOO_MODELS", "SAE_STORES", "PRECOMPUTED", "RESULTS", "DOCS", "VIEWS"} <= set(named)
    missing = [name for name, path in named.items() if not path.exists()]
    assert not missing, f"analysis/framework/paths.py names folders that do not exist: {missing}"


def test_the_filtering_result_the_sae_page_reads_is_where_the_benchmark_writes_it():
    from components.figures import sae as figures

    assert figures.FILTERING_RESULTS == paths.RESULTS / "sae_v_filtering.json"


def test_no_file_computes_a_project_path_by_hand():
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=paths.ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    allowed = {"analysis/framework/paths.py", "tests/conftest.py"}
    offenders = []
    for name in tracked:
        if name in allowed or not (paths.ROOT / name).is_file():
            continue
        for number, line in enumerate((paths.ROOT / name).read_text().splitlines(), 1):
            if HAND_MADE.search(line) and line.strip() != BOOTSTRAP and BOOTSTRAP not in line:
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert not offenders, "use analysis.framework.paths instead:\n" + "\n".join(offenders)
