"""How a results file names a model: as a user would type it (`zoo:smollm2-135m-instruct`), never by a path
of the machine that ran the benchmark.

A `local:` folder that is a finished conversion of one of the zoo's real models (the converter's
`conversion.json` and a config, `real_models.is_built`) is that zoo model; any other local folder is named by
its folder name alone.
"""
from __future__ import annotations

from pathlib import Path

from analysis.model_access import real_models
from analysis.model_access.models import ModelSpec


def result_name(spec: str) -> str:
    parsed = ModelSpec.parse(spec)
    if parsed.source != "local":
        return parsed.label
    folder = Path(parsed.name)
    if folder.name in real_models.names() and real_models.is_built(folder.name, folder.parent):
        return f"zoo:{folder.name}"
    return f"local:{folder.name}"
