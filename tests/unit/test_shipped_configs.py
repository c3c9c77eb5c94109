"""What every shipped configuration and the server's start-up promise (#50): each deploy/*.toml keeps the
public limits it does not name, `*.env` files are neither committed nor copied into the image, the secrets
file written at start-up is gone when the server exits, and real models are converted before it listens."""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from analysis.framework import config as cfg
from conftest import ROOT

DEPLOY = ROOT / "deploy"
PUBLIC = cfg.parse((DEPLOY / "public.toml").read_text(), str(DEPLOY / "public.toml"))
SHIPPED = sorted(p for p in DEPLOY.glob("*.toml") if p.name != "public.toml")
GUARDED = ("uploads", "limits", "gallery", "auth")  # what keeps a stranger's use bounded


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_configuration_keeps_every_public_limit_it_does_not_name(path):
    own = tomllib.loads(path.read_text())
    config = cfg.parse(path.read_text(), str(path))
    assert config.public == PUBLIC.public or "public" in own
    for section in GUARDED:
        mine, public = getattr(config, section), getattr(PUBLIC, section)
        for f in dataclasses.fields(public):
            if f.name not in own.get(section, {}):
                assert getattr(mine, f.name) == getattr(public, f.name), f"{path.name}: [{section}] {f.name}"


def test_extends_merges_key_by_key_and_refuses_loops(tmp_path):
    (tmp_path / "a.toml").write_text('extends = "b.toml"\n[limits]\nruns_per_minute = 3\n')
    (tmp_path / "b.toml").write_text('public = true\n[limits]\nruns_per_minute = 9\nvisitor_runs = 1\n')
    config = cfg.parse((tmp_path / "a.toml").read_text(), str(tmp_path / "a.toml"))
    assert config.public and config.limits.runs_per_minute == 3 and config.limits.visitor_runs == 1
    (tmp_path / "b.toml").write_text('extends = "a.toml"\n')
    with pytest.raises(cfg.ConfigError, match="loop"):
        cfg.parse((tmp_path / "a.toml").read_text(), str(tmp_path / "a.toml"))


def test_env_files_are_neither_committed_nor_copied_into_the_image():
    for name in ("prod.env", "deploy/ndif.env", ".env"):
        out = subprocess.run(["git", "check-ignore", "-q", "--no-index", name], cwd=ROOT)
        assert out.returncode == 0, f"{name} is not git-ignored"
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    assert "*.env" in patterns and "**/*.env" in patterns


def _serve():
    spec = importlib.util.spec_from_file_location("serve_script", ROOT / "scripts" / "serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_secrets_file_written_at_start_up_is_removed_at_exit(tmp_path):
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('s', 'scripts/serve.py'); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            "print(m.secrets_from_env()[1]); sys.exit(0)")
    env = dict(os.environ, MODEL_INSPECTOR_SECRETS='[auth]\ncookie_secret = "x"\n', TMPDIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    written = Path(out.stdout.strip())
    assert written.is_relative_to(tmp_path) and written.name == "secrets.toml"
    assert not written.exists() and not written.parent.exists()


def test_real_models_are_converted_before_the_server_listens(monkeypatch, tmp_path):
    from analysis.model_access import real_models

    serve = _serve()
    converted = []
    monkeypatch.setattr(real_models, "is_built", lambda name, root=None: False)
    monkeypatch.setattr(real_models, "is_installed", lambda name: True)
    monkeypatch.setattr(real_models, "ensure", lambda name, *a, **k: converted.append(name))
    monkeypatch.delenv(cfg.CONFIG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)  # no ./model_inspector.toml: the local defaults offer the real model
    assert serve.convert_real_models() == real_models.names() == converted
    no_zoo = tmp_path / "hub-only.toml"
    no_zoo.write_text('[models]\nsources = ["hub"]\ndefault = "hub:gpt2"\n')
    monkeypatch.setenv(cfg.CONFIG_ENV, str(no_zoo))
    converted.clear()
    assert serve.convert_real_models() == [] and converted == []  # an instance that offers no zoo model
    source = (ROOT / "scripts" / "serve.py").read_text()
    assert source.index("convert_real_models()\n") < source.index("streamlit_cli.main()")
