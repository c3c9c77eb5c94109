"""Several sessions opening different pages at the same moment in a fresh interpreter: no import race.

Before app.py preloaded the heavy modules, two script threads importing pandas / transformers for the
first time together could get a half-initialised module (`partially initialized module 'pandas' has no
attribute 'Series'`, `cannot import name 'AutoConfig' from 'transformers'`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from analysis.model_access.models import zoo_models

from analysis.framework.paths import ROOT

SCRIPT = textwrap.dedent("""
    import json, sys, threading
    sys.path.insert(0, {root!r})
    from streamlit.testing.v1 import AppTest
    from analysis.model_access.models import ModelSpec

    PAGES = [
        ("views/sae_features.py", "shapes-vlm", {{}}),
        ("views/caption_correction.py", "shapes-vlm",
         {{"cap": "paste", "text": "there is a red circle .", "ground": "0", "dec": "grammar", "rew": "grammar"}}),
        ("views/attention_sharpness.py", "shapes-lm", {{"ns": "2", "samples": "1"}}),
        ("views/kv_cache.py", "shapes-lm", {{"context": "32", "examples": "1"}}),
        ("views/prompt_reconstruction.py", "shapes-lm", {{"prompt": "there is", "sweeps": "0", "exhaustive": "0"}}),
        ("views/overview.py", "shapes-lm", {{}}),
    ]
    barrier = threading.Barrier(len(PAGES))
    out = {{}}

    def open_page(page, model, query):
        at = AppTest.from_file({app!r}, default_timeout=600)
        at.session_state["model_spec"] = ModelSpec("zoo", model)
        for key, value in query.items():
            at.query_params[key] = value
        at.switch_page(page)
        barrier.wait()  # every session starts its first run together
        try:
            at.run()
            out[page] = [e.value for e in at.exception]
        except Exception as exc:
            out[page] = [repr(exc)]

    threads = [threading.Thread(target=open_page, args=p) for p in PAGES]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.skipif(not {"shapes-lm", "shapes-vlm"} <= set(zoo_models()), reason="needs the demo zoo")
def test_pages_opened_together_in_a_fresh_interpreter_do_not_race_on_imports():
    script = SCRIPT.format(root=str(ROOT), app=str(ROOT / "app.py"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert len(result) == 6
    assert all(not errors for errors in result.values()), result
