"""A throwaway PostgreSQL server on the loopback, for the store tests and for trying replicas locally.

    python scripts/local_postgres.py [--port 5433]     # prints the URL; Ctrl-C stops it and deletes it

Uses Debian's `postgresql` package (`scripts/install_postgres.sh` installs it): initdb into a fresh
temporary folder, trust authentication on 127.0.0.1 only, one database `inspector`. As root, the
server runs as the `postgres` user (PostgreSQL refuses to run as root). `find_binaries()` returns
None when the package is missing; tests skip then, saying so.
"""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

INSTALL_HINT = "install Debian's postgresql package (bash scripts/install_postgres.sh)"


def find_binaries() -> Path | None:
    """The folder holding initdb and postgres (Debian keeps them off PATH), newest version first."""
    found = shutil.which("initdb")
    if found and (Path(found).resolve().parent / "postgres").exists():
        return Path(found).resolve().parent
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True):
        if (Path(folder) / "initdb").exists() and (Path(folder) / "postgres").exists():
            return Path(folder)
    return None


def free_port(preferred: range = range(5433, 5440)) -> int:
    for port in [*preferred, 0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port")


@dataclass
class LocalPostgres:
    folder: Path
    port: int
    process: subprocess.Popen

    @property
    def url(self) -> str:
        return f"postgresql://inspector@127.0.0.1:{self.port}/inspector"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # SIGTERM: "smart" shutdown
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    runuser = shutil.which("runuser")
    if runuser is None:
        raise RuntimeError("running as root without runuser: cannot start PostgreSQL as the postgres user")
    return [runuser, "-u", "postgres", "--", *cmd]


def start(port: int | None = None, timeout_s: float = 60) -> LocalPostgres:
    """initdb + postgres on 127.0.0.1:`port`; returns once it accepts connections."""
    bin_dir = find_binaries()
    if bin_dir is None:
        raise RuntimeError(f"PostgreSQL is not installed: {INSTALL_HINT}")
    folder = Path(tempfile.mkdtemp(prefix="mi-postgres-"))
    data, sockets = folder / "data", folder / "sockets"
    sockets.mkdir()
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
        shutil.chown(sockets, "postgres")
    init = subprocess.run(_as_postgres([str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "inspector",
                                        "-E", "UTF8", "--no-sync", "--locale", "C"]),
                          capture_output=True, text=True)
    if init.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise RuntimeError(f"initdb failed: {init.stderr.strip()[-800:]}")
    port = port or free_port()
    log = open(folder / "server.log", "w")
    proc = subprocess.Popen(_as_postgres([str(bin_dir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(sockets),
                                          "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200"]),
                            stdout=log, stderr=subprocess.STDOUT)
    server = LocalPostgres(folder, port, proc)
    deadline = time.time() + timeout_s
    import psycopg

    while True:
        if proc.poll() is not None:
            text = (folder / "server.log").read_text()[-800:]
            server.stop()
            raise RuntimeError(f"postgres exited: {text}")
        try:
            with psycopg.connect(f"postgresql://inspector@127.0.0.1:{port}/postgres", autocommit=True,
                                 connect_timeout=2) as conn:
                conn.execute("CREATE DATABASE inspector")
            return server
        except psycopg.OperationalError:
            if time.time() > deadline:
                server.stop()
                raise RuntimeError(f"postgres did not accept connections within {timeout_s:.0f} s")
            time.sleep(0.2)


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args()
    try:
        server = start(args.port)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"MODEL_INSPECTOR_STORE={server.url}", flush=True)
    try:
        server.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
