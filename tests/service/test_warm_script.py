"""scripts/warm.py, run as a file from any folder: it lists every panel's default view (and each preset link)
that it would open, without opening one, and refuses an unknown option with argparse's usage line."""
from __future__ import annotations

import subprocess
import sys

from analysis.framework import panels
from analysis.framework.paths import ROOT, SCRIPTS


def _warm(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / "warm.py"), *args], cwd=cwd or ROOT, capture_output=True,
                          text=True, timeout=120, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})


def test_the_script_lists_each_panel_s_default_view_from_any_folder(tmp_path):
    out = _warm("--list", "--no-presets", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    pages = {a.url_path for a in panels.analyses() if a.page}
    listed = {line.split()[0] for line in out.stdout.splitlines() if "(default)" in line}
    assert listed == pages, (listed, pages)


def test_the_script_lists_only_the_panels_asked_for():
    out = _warm("--list", "--no-presets", "--panels", "kv-cache")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() and all(line.startswith("kv-cache ") for line in out.stdout.splitlines())


def test_an_unknown_option_is_one_usage_error():
    out = _warm("--no-such-option")
    assert out.returncode == 2 and "usage: python scripts/warm.py" in out.stderr
