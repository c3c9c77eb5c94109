"""Committed benchmark results name models as a user would type them (`zoo:…`), never by a path of the
machine that ran them; the benchmarks write names through `benchmarks/result_names.py`."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from analysis.framework.paths import RESULTS
from analysis.model_access import real_models
from benchmarks.result_names import result_name

# An absolute POSIX path of two parts or more (`/work/models/x`, `local:/home/me/m`), a home-relative one or a
# Windows drive path; "tokens/s" or "1/2" are not (a letter or digit stands before the slash).
MACHINE_PATH = re.compile(r"(?:^|[^\w.~/-])(/[A-Za-z_][\w.-]*/[\w./-]*|~/[\w.-]+|[A-Za-z]:\\[\w\\.-]+)")


def _strings(value):
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


def machine_paths(data) -> list[str]:
    return [m.group(1) for s in _strings(data) for m in MACHINE_PATH.finditer(s)]


def test_the_path_finder_finds_paths_and_leaves_units_alone():
    assert machine_paths({"local:/work/models/smollm2-135m-instruct": {"model": "zoo:smollm2-135m-instruct"}}) == [
        "/work/models/smollm2-135m-instruct"]
    assert machine_paths(["| /home/me/x | 3 |", "~/models", r"C:\Users\me"]) == ["/home/me/x", "~/models", r"C:\Users\me"]
    assert machine_paths(["12 tokens/s", "1/2 of n", "zoo:shapes-lm", "a / b", "benchmarks/results/kv.json"]) == []


def test_no_result_file_names_a_machine_path():
    found = {p.name: machine_paths(json.loads(p.read_text())) for p in sorted(RESULTS.glob("*.json"))}
    found = {name: sorted(set(paths)) for name, paths in found.items() if paths}
    assert not found, f"result files naming a machine path (write zoo:<name> or the folder's name): {found}"


def test_a_result_names_a_converted_real_model_as_the_zoo_does(tmp_path):
    name = real_models.names()[0]
    source = real_models.folder(name)
    if not real_models.is_built(name):
        pytest.skip("the converted real model is not in this checkout's zoo")
    copy = tmp_path / "models" / name
    copy.mkdir(parents=True)
    for part in ("config.json", real_models.MARKER):
        shutil.copy(source / part, copy / part)
    assert result_name(f"local:{copy}") == f"zoo:{name}"
    (copy / real_models.MARKER).unlink()  # not a finished conversion: only its folder's name
    assert result_name(f"local:{copy}") == f"local:{name}"
    assert result_name(f"local:{tmp_path}/mine/tiny-llama") == "local:tiny-llama"
    assert result_name("zoo:shapes-lm") == "zoo:shapes-lm"
    assert result_name("hub:HuggingFaceTB/SmolLM2-135M-Instruct") == "hub:HuggingFaceTB/SmolLM2-135M-Instruct"
