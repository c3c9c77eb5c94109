"""A reverse proxy in a few lines that does what nginx's
`proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for` does: the client's own X-Forwarded-For
(if any), then the address the proxy saw. The public-instance battery (tests/public_instance.py) and the
hostile load benchmark (benchmarks/hostile_load.py) put it in front of a server on this machine.

    proxy = AppendingProxy(8501, peer="203.0.113.7")   # its clients all look like 203.0.113.7
    ... connect to proxy.base ...

`peer` stands for the address a real proxy would see (None: the real one, 127.0.0.1 here), so several
proxies are several people. Loopback only.
"""
from __future__ import annotations

import socket
import threading


class AppendingProxy:
    """A TCP proxy in front of the server that appends the address it saw to X-Forwarded-For, as nginx's
    `$proxy_add_x_forwarded_for` does (and passes websocket upgrades through). Plain requests get
    `Connection: close`, so each request of a keep-alive client is rewritten on its own connection."""

    def __init__(self, upstream_port: int, peer: str | None = None) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.peer = peer  # None: the real peer address
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.seen: list[str] = []  # the X-Forwarded-For each request went on with
        self._open = True
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._open = False
        self.listener.close()

    def _accept(self) -> None:
        while self._open:
            try:
                client, address = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client, address[0]), daemon=True).start()

    def _serve(self, client: socket.socket, address: str) -> None:
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = client.recv(65536)
                if not chunk:
                    client.close()
                    return
                head += chunk
            head, rest = head.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            forwarded = [v.split(":", 1)[1].strip() for v in lines[1:] if v.lower().startswith("x-forwarded-for:")]
            kept = [v for v in lines[1:] if not v.lower().startswith("x-forwarded-for:")]
            upgrade = any(v.lower().startswith("upgrade:") for v in kept)
            if not upgrade:
                kept = [v for v in kept if not v.lower().startswith("connection:")] + ["Connection: close"]
            chain = ", ".join(forwarded + [self.peer or address])
            self.seen.append(chain)
            out = "\r\n".join([lines[0], *kept, f"X-Forwarded-For: {chain}"]).encode("latin-1") + b"\r\n\r\n" + rest
            upstream = socket.create_connection(self.upstream)
            upstream.sendall(out)
        except OSError:
            client.close()
            return
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
        _pipe(client, upstream)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
