"""One real public server for the battery (tests/service/test_public_server.py, tests/browser/
test_public_browser.py): `scripts/serve.py` with `deploy/public.toml`, started once per test process.

What differs from the example file, and why:
- `uploads.keep_seconds = 30`: expiry is observed within the test run (the example keeps uploads an hour);
- `auth.mode = "oidc"` (signed-out visitors read-only, as the example's `signed_out`) with secrets whose
  issuer is a closed loopback port: the unreachable-provider case; signed-out visitors see what an
  anonymous visitor of the example sees;
- its store, upload area and caches live in a temporary folder.

The server runs with an audit hook (`sitecustomize.py` on its PYTHONPATH) that writes down every name
it resolves and every address it connects to other than loopback: a hostile link must leave that file
empty. HF_HUB_OFFLINE is *not* set for it: serve.py must set it itself (the Hub is not a source).

`server.proxy(peer)` puts scripts/appending_proxy.py's proxy in front (nginx's
`$proxy_add_x_forwarded_for`): two proxies with two `peer` addresses are two real visitors.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from analysis.framework.paths import DEPLOY, ROOT, SCRIPTS  # noqa: E402

sys.path.insert(0, str(SCRIPTS))
import screenshot  # noqa: E402
from appending_proxy import AppendingProxy  # noqa: E402  (nginx's $proxy_add_x_forwarded_for, for the tests)

KEEP_SECONDS = 30  # long enough that a slow machine's five uploads never expire mid-case (a case takes ~8 s)
COOKIE_SECRET = "battery-cookie-secret-not-a-real-one"

AUDIT = '''
import os, sys
_LOG = os.environ.get("MI_AUDIT_LOG")
_LOCAL = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "", None}

def _note(kind, what):
    with open(_LOG, "a") as fh:
        fh.write(f"{kind} {what}\\n")

def _hook(event, args):
    if event == "socket.getaddrinfo":
        host = args[0].decode() if isinstance(args[0], bytes) else args[0]
        if host not in _LOCAL:
            _note("resolve", host)
    elif event == "socket.connect":
        address = args[1]
        if isinstance(address, tuple) and address and str(address[0]) not in _LOCAL \\
                and not str(address[0]).startswith("127."):
            _note("connect", address)

if _LOG:
    sys.addaudithook(_hook)
'''


def _config(tmp: Path) -> Path:
    text = (DEPLOY / "public.toml").read_text()
    for old, new in [("keep_seconds = 3600", f"keep_seconds = {KEEP_SECONDS}"),
                     ('mode = "none"', 'mode = "oidc"')]:
        text = text.replace(old, new)
    path = tmp / "public.toml"
    path.write_text(text)
    return path


def _secrets(tmp: Path, issuer_port: int) -> Path:
    path = tmp / "secrets.toml"
    path.write_text(f'''[auth]
redirect_uri = "http://127.0.0.1:9/oauth2callback"
cookie_secret = "{COOKIE_SECRET}"
client_id = "battery"
client_secret = "battery-secret"
server_metadata_url = "http://127.0.0.1:{issuer_port}/.well-known/openid-configuration"
''')
    return path


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PublicServer:
    base: str
    port: int
    proc: subprocess.Popen
    tmp: Path
    cache: Path
    audit: Path
    store: Path
    proxies: list = field(default_factory=list)

    @property
    def uploads(self) -> Path:
        return self.cache / "sae" / "uploads"

    def upload_bytes(self) -> int:
        if not self.uploads.exists():
            return 0
        return sum(p.stat().st_size for p in self.uploads.rglob("*") if p.is_file())

    def partials(self) -> list[Path]:
        return [p for p in self.uploads.rglob("*.partial")] if self.uploads.exists() else []

    def contacted(self) -> list[str]:
        return self.audit.read_text().splitlines() if self.audit.exists() else []

    def proxy(self, peer: str | None = None) -> "AppendingProxy":
        proxy = AppendingProxy(self.port, peer)
        self.proxies.append(proxy)
        return proxy

    def stop(self) -> None:
        for proxy in self.proxies:
            proxy.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)


# A test file that uses `shared()` carries this mark, saying so. In a parallel run (scripts/test.sh, --dist loadfile)
# each worker that runs such a file starts the server once for all of them (pytest-xdist 3.8's loadgroup, which
# would put them on one worker, groups nothing under pytest 9).
ON_SHARED_SERVER = pytest.mark.xdist_group("public-server")

_SHARED: PublicServer | None = None
_LOCK = threading.Lock()


def shared() -> PublicServer:
    """The battery's server, started on first use and stopped when the test process ends."""
    global _SHARED
    with _LOCK:
        if _SHARED is None or _SHARED.proc.poll() is not None:
            _SHARED = start()
            atexit.register(_SHARED.stop)
        return _SHARED


def start() -> PublicServer:
    tmp = Path(tempfile.mkdtemp(prefix="mi-public-"))
    (tmp / "hook").mkdir()
    (tmp / "hook" / "sitecustomize.py").write_text(AUDIT)
    audit = tmp / "contacted.log"
    cache = tmp / "cache"
    store = tmp / "analyses.db"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "MODEL_INSPECTOR_ROOTS")}
    env.update({"MODEL_INSPECTOR_CONFIG": str(_config(tmp)), "MODEL_INSPECTOR_STORE": str(store),
                "MODEL_INSPECTOR_CACHE": str(cache), "MI_AUDIT_LOG": str(audit),
                "PYTHONPATH": os.pathsep.join([str(tmp / "hook"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    port = screenshot.free_port()
    cmd = [sys.executable, str(ROOT / "scripts" / "serve.py"), "--server.port", str(port), "--server.address",
           "127.0.0.1", "--server.headless", "true", "--secrets.files", str(_secrets(tmp, closed_port()))]
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    screenshot.wait_healthy(proc, port, timeout_s=300, poll_s=0.2, what="the public server")
    return PublicServer(f"http://127.0.0.1:{port}", port, proc, tmp, cache, audit, store)


def wait_for(predicate, timeout_s: float, poll_s: float = 0.5):
    """Poll until `predicate()` is truthy (returns it) or the time is up (returns the last value)."""
    deadline = time.time() + timeout_s
    value = predicate()
    while not value and time.time() < deadline:
        time.sleep(poll_s)
        value = predicate()
    return value


def dump(obj) -> str:
    return json.dumps(obj, indent=1, default=str)
