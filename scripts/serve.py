"""Start the app like `streamlit run app.py`, with every heavy module imported before the server listens.

    python scripts/serve.py [streamlit options, e.g. --server.port 8501]

`components/preload.py` (which app.py imports first, against import races) takes seconds on a small
machine. Under plain `streamlit run` the first visitors pay for it: the server reports healthy at
once and the first script run imports everything. Here the import happens first, in the server's
own process, so the first page a visitor opens finds every module loaded. It also measures this
machine's speed on each demo model while the machine is idle (`preload.calibrate_zoo`), for the
pages' cost estimates.

Before that it checks the deployment (docs/deploy.md): the configuration file
($MODEL_INSPECTOR_CONFIG or ./model_inspector.toml), the saved-analyses store (a SQLite file or a
postgresql:// URL, migrated here) and, for OIDC sign-in, the [auth] secrets must be usable, or it exits
with one `error:` line (an instance whose sign-in cannot work must not report healthy). From the
configuration: Streamlit's upload limit (server.maxUploadSize) follows `uploads.max_mb` unless given
here; a public instance (`public = true`) shows visitors no error details (client.showErrorDetails
none); without the Hub among the model sources nothing may reach the Hub (HF_HUB_OFFLINE=1). The
server's own guards (uploads held in memory, the sign-in error page: components/server_guards.py) and
the sweeper that deletes expired uploads (analysis/framework/uploads.py) start with it.

Secrets (OIDC's [auth]) come from Streamlit's secrets files, or from $MODEL_INSPECTOR_SECRETS: the text
of a secrets.toml (a Space secret, `docker run -e`), written to a file only this user can read, outside
the checkout, given to Streamlit as `--secrets.files` (an explicit `--secrets.files` flag wins) and
removed when the server exits.

The real zoo models this instance offers are converted before it listens (the image does it at build),
never by a visitor's first load.

Torch's threads: every core, waiting passively between parallel regions, or MODEL_INSPECTOR_THREADS=N
(analysis/model_access/threads.py), set before anything imports torch.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import ROOT  # noqa: E402  (every project path comes from analysis/framework/paths.py)


def _option(argv: list[str], name: str) -> str | None:
    """A `--name value` or `--name=value` Streamlit option from the command line."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


SECRETS_ENV = "MODEL_INSPECTOR_SECRETS"


def secrets_from_env() -> list[str]:
    """With $MODEL_INSPECTOR_SECRETS (the text of a secrets.toml: a Space secret, `docker run -e`), that
    text in a file only this user can read, outside the checkout and the image, for Streamlit's
    `--secrets.files`; [] without it."""
    import atexit
    import os
    import shutil
    import tempfile

    text = os.environ.get(SECRETS_ENV, "")
    if not text.strip():
        return []
    folder = tempfile.mkdtemp(prefix="model-inspector-secrets-")  # 0700
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # the file lives as long as the server
    path = os.path.join(folder, "secrets.toml")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return ["--secrets.files", path]


def secret_files(argv: list[str]) -> list[str]:
    """The secrets files Streamlit will read (its `secrets.files` option: flag, environment, config.toml)."""
    from streamlit import config as st_config

    flag = _option(argv, "--secrets.files")
    st_config.get_config_options(force_reparse=True, options_from_flags={"secrets.files": [flag]} if flag else {})
    return list(st_config.get_option("secrets.files"))


def convert_real_models() -> list[str]:
    """Convert now, before the server listens, each real zoo model this instance offers and that is not
    converted yet (SmolLM2: about 35 s and 517 MB), so that no visitor's first load pays for it; the names
    converted. A conversion that fails is said here and left to the loader's own message."""
    from analysis.framework import config
    from analysis.model_access import real_models

    settings = config.current()
    done = []
    for name in real_models.names():
        if settings.model_refusal("zoo", name) or real_models.is_built(name) or not real_models.is_installed(name):
            continue
        print(f"Converting the real model {name} before the server starts ...", file=sys.stderr)
        try:
            real_models.ensure(name)
            done.append(name)
        except Exception as exc:  # noqa: BLE001  (the server still starts; loading it then says why)
            print(f"warning: {name} could not be converted: {exc}", file=sys.stderr)
    return done


def check_deployment(argv: list[str]) -> list[str]:
    """The configuration, the store and the sign-in secrets, checked before the server starts; extra
    Streamlit options the configuration implies."""
    import math
    import os

    from analysis.framework import config
    from analysis.hosting.store import StoreError, open_store

    try:
        settings = config.current()
        open_store(settings.store or None)  # creates or migrates the schema; a bad URL fails here
        problem = config.oidc_problem(settings, config.read_secrets(secret_files(argv)) if
                                      settings.auth.mode == "oidc" else {})
        if problem:
            raise config.ConfigError(problem)
    except (config.ConfigError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    if "hub" not in settings.models.sources:  # nothing a visitor names may reach the Hub (sae-lens included)
        os.environ["HF_HUB_OFFLINE"] = "1"
    extra = []
    if not any(a.startswith("--server.maxUploadSize") for a in argv):
        extra += ["--server.maxUploadSize", str(max(1, math.ceil(settings.uploads.max_mb)))]
    if settings.public and not any(a.startswith("--client.showErrorDetails") for a in argv):
        extra += ["--client.showErrorDetails", "none"]
    return extra


if __name__ == "__main__":
    if _option(sys.argv[1:], "--secrets.files") is None:  # before the checks: they read the same secrets
        sys.argv[1:] = [*secrets_from_env(), *sys.argv[1:]]
    extra = check_deployment(sys.argv[1:])  # in a second, before the heavy imports below
    from analysis.model_access import threads

    try:  # before torch is imported (components.preload): see analysis/model_access/threads.py
        threads.configure()
    except threads.ThreadsError as exc:
        sys.exit(f"error: {exc}")
    import components.preload  # (the same module app.py imports first)
    from analysis.framework import uploads
    from components import server_guards
    from streamlit.web import cli as streamlit_cli
    # Each demo model's speed, measured now while the machine is idle (a fraction of a second each):
    # measured later, inside a crowd's first burst, it reads far too slow (components/preload.py).
    convert_real_models()
    components.preload.calibrate_zoo()
    server_guards.install()
    uploads.start_sweeper()
    # No file watcher: a demo server's sources do not change under it, and watching them is not free.
    # Streamlit (watchdog) watches the folders of every imported module of the app; reading a model or
    # a feature store there queues inotify events, and on overflow it walks the whole tree again.
    # Profiled with six users at once, that was more CPU than all six pages' script runs together.
    # Pass --server.fileWatcherType auto to get auto-reload back while editing.
    sys.argv = ["streamlit", "run", str(ROOT / "app.py"), "--server.fileWatcherType", "none", *extra,
                *sys.argv[1:]]
    sys.exit(streamlit_cli.main())
