"""Start the app like `streamlit run app.py`, with every heavy module imported before the server listens.

    python scripts/serve.py [streamlit options, e.g. --server.port 8501]

`components/preload.py` (which app.py imports first, against import races) takes seconds on a small
machine. Under plain `streamlit run` the first visitors pay for it: the server reports healthy at
once and the first script run imports everything. Here the import happens first, in the server's
own process, so the first page a visitor opens finds every module loaded. It also measures this
machine's speed on each demo model while the machine is idle (`preload.calibrate_zoo`), for the
pages' cost estimates.

Before that it checks the deployment (docs/deploy.md): the configuration file
($MODEL_INSPECTOR_CONFIG or ./model_inspector.toml) and the saved-analyses store (a SQLite file or a
postgresql:// URL, migrated here) must be usable, or it exits with one `error:` line. Streamlit's
upload limit (server.maxUploadSize) follows the configuration's `uploads.max_mb` unless given here.

Torch's threads: every core, waiting passively between parallel regions, or MODEL_INSPECTOR_THREADS=N
(analysis/threads.py), set before anything imports torch.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.paths import ROOT  # noqa: E402  (every project path comes from analysis/paths.py)


def check_deployment(argv: list[str]) -> list[str]:
    """The configuration and the store, checked before the server starts; extra Streamlit options."""
    import math

    from analysis import config
    from analysis.store import StoreError, open_store

    try:
        settings = config.current()
        open_store(settings.store or None)  # creates or migrates the schema; a bad URL fails here
    except (config.ConfigError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    extra = []
    if not any(a.startswith("--server.maxUploadSize") for a in argv):
        extra += ["--server.maxUploadSize", str(max(1, math.ceil(settings.uploads.max_mb)))]
    return extra


if __name__ == "__main__":
    extra = check_deployment(sys.argv[1:])  # in a second, before the heavy imports below
    from analysis import threads

    try:  # before torch is imported (components.preload): see analysis/threads.py
        threads.configure()
    except threads.ThreadsError as exc:
        sys.exit(f"error: {exc}")
    import components.preload  # (the same module app.py imports first)
    from streamlit.web import cli as streamlit_cli
    # Each demo model's speed, measured now while the machine is idle (a fraction of a second each):
    # measured later, inside a crowd's first burst, it reads far too slow (components/preload.py).
    components.preload.calibrate_zoo()
    # No file watcher: a demo server's sources do not change under it, and watching them is not free.
    # Streamlit (watchdog) watches the folders of every imported module of the app; reading a model or
    # a feature store there queues inotify events, and on overflow it walks the whole tree again.
    # Profiled with six users at once, that was more CPU than all six pages' script runs together.
    # Pass --server.fileWatcherType auto to get auto-reload back while editing.
    sys.argv = ["streamlit", "run", str(ROOT / "app.py"), "--server.fileWatcherType", "none", *extra,
                *sys.argv[1:]]
    sys.exit(streamlit_cli.main())
