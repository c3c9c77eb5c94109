"""The container recipe, checked where no container can be built (no Docker engine in CI): the
Dockerfile installs with scripts/install.sh, the script the README's run and test commands run (so
.ci/run exercises the same steps), as a non-root user, with CPU torch, a health check on port 8501 and
the demo zoo inside; docs/deploy.md's Spaces metadata names the same port; serve.py refuses a bad
configuration or an unreachable store with one line."""
from __future__ import annotations

import re
import subprocess
import sys

from analysis.framework.paths import ROOT
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)  # join continuation lines
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_installs_with_the_shared_script_as_a_non_root_user():
    steps = instructions()
    runs = [rest for word, rest in steps if word == "RUN"]
    assert any(r == "bash scripts/install.sh" for r in runs)
    assert not any("pip install" in r for r in runs), "install steps belong in scripts/install.sh"
    users = [rest for word, rest in steps if word == "USER"]
    assert users and users[-1] not in ("root", "0")
    install_at = [i for i, (w, r) in enumerate(steps) if w == "RUN" and "install.sh" in r][0]
    user_at = [i for i, (w, _) in enumerate(steps) if w == "USER"][-1]
    assert user_at < install_at  # the virtualenv belongs to the user who runs the app
    assert "uid 1000" in DOCKERFILE or "--uid 1000" in DOCKERFILE  # Spaces runs as uid 1000
    assert any(w == "ENV" and "download.pytorch.org/whl/cpu" in r for w, r in steps)  # CPU torch
    assert any(w == "ENV" and "MODEL_INSPECTOR_REQUIRE_CPU_TORCH=1" in r for w, r in steps)


def test_dockerfile_serves_on_8501_with_a_health_check_and_the_public_example():
    steps = dict((w, r) for w, r in instructions() if w in ("EXPOSE", "HEALTHCHECK", "CMD"))
    assert steps["EXPOSE"] == "8501"
    assert "/_stcore/health" in steps["HEALTHCHECK"] and "8501" in steps["HEALTHCHECK"]
    assert "scripts/serve.py" in steps["CMD"] and '"8501"' in steps["CMD"] and '"0.0.0.0"' in steps["CMD"]
    env = " ".join(r for w, r in instructions() if w == "ENV")
    config = re.search(r"MODEL_INSPECTOR_CONFIG=(\S+)", env).group(1)
    assert (ROOT / config).is_file()


def test_docker_context_keeps_the_demo_zoo():
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for pattern in ignored:
        assert not "analysis/zoo".startswith(pattern.rstrip("/")) and "zoo" not in pattern
    tracked = subprocess.run(["git", "ls-files", "analysis/zoo/models"], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    assert any(p.endswith("shapes-lm/model.safetensors") for p in tracked)
    assert any(p.endswith("shapes-vlm/model.safetensors") for p in tracked)


def test_readme_commands_and_ci_run_the_install_script():
    for script in ("scripts/run_app.sh", "scripts/test.sh"):
        assert "bash scripts/install.sh" in (ROOT / script).read_text(), script
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    test_sh = (ROOT / "scripts" / "test.sh").read_text()
    assert "install_postgres.sh" in test_sh  # the shared-store tests get a real PostgreSQL


def test_spaces_metadata_matches_the_container():
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    block = re.search(r"```yaml\n---\n(.*?)\n---\n```", deploy, re.S).group(1)
    assert "sdk: docker" in block and "app_port: 8501" in block
    readme = (ROOT / "README.md").read_text()
    if readme.startswith("---\n"):  # once the README carries it, it must say the same
        front = readme.split("---\n")[1]
        assert "sdk: docker" in front and "app_port: 8501" in front


def test_serve_refuses_a_bad_deployment_with_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[models]\nsources = ["ftp"]\n')
    env = {"MODEL_INSPECTOR_CONFIG": str(bad), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "serve.py")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("error: models.sources")
    env = {"MODEL_INSPECTOR_STORE": "postgresql://nobody@127.0.0.1:1/none", "PATH": "/usr/bin:/bin",
           "HF_HUB_OFFLINE": "1", "MODEL_INSPECTOR_CONFIG": str(ROOT / "deploy" / "public.toml")}
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "serve.py")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("error: cannot reach the saved-analyses database")


# ---------------------------------------------------------------------------------------------
# #39: any builder, no tests or secrets in the image, the real model converted at build time


BUILDKIT_ONLY = [r"^#\s*syntax\s*=", r"<<[-~]?['\"]?\w+", r"--mount\b", r"--link\b", r"--chmod\b", r"--parents\b",
                 r"--exclude\b", r"--checksum\b", r"--network\b", r"--security\b"]


def test_dockerfile_builds_without_buildkit():
    """Nothing only BuildKit understands, and no folder the builder creates itself for the non-root user
    (the classic builder, Buildah and Kaniko create a WORKDIR as root: the install then fails)."""
    steps = instructions()
    text = "\n".join(f"{word} {rest}" for word, rest in steps)  # the instructions, without comments
    assert not re.search(BUILDKIT_ONLY[0], DOCKERFILE, re.M)  # a syntax directive is a comment line
    for pattern in BUILDKIT_ONLY[1:]:
        assert not re.search(pattern, text, re.M), pattern
    made = " ".join(rest for word, rest in steps if word == "RUN")
    for i, (word, rest) in enumerate(steps):
        if word == "WORKDIR":
            assert f"mkdir -p {rest}" in made or re.search(rf"mkdir -p [^&]*{re.escape(rest)}", made), rest
            assert any(w == "RUN" and "chown" in r and "/home/inspector" in r for w, r in steps[:i]), rest


def test_the_real_model_is_converted_at_build_time():
    steps = instructions()
    runs = [rest for word, rest in steps if word == "RUN"]
    install_at = runs.index("bash scripts/install.sh")
    assert any("analysis.zoo build --only smollm2-135m-instruct" in r for r in runs[install_at + 1:])


def test_no_tests_and_no_secrets_in_the_image_or_the_repository():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {"tests", ".streamlit/secrets.toml", "**/secrets.toml"} <= ignored
    assert "benchmarks/results" not in ignored  # the SAE-V page reads a benchmark's result
    for path in (".streamlit/secrets.toml", "deploy/secrets.toml", ".env"):
        out = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
        assert out.returncode == 0, f"{path} is not git-ignored"
