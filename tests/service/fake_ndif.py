"""A local stand-in for the NDIF endpoint nnsight's non-blocking remote backend talks to, in its own process.

POST /request (multipart: `data` = the JSON envelope, `blob` = the serialized trace), GET /response/<id>
(a job's status; RUNNING once, then COMPLETED with a download address), GET /result/<id> (the saves,
torch.save'd and zstd-compressed as the request asked). It checks the `ndif-api-key` header, hosts the
model keys it is given (each loaded here from its folder with transformers, as NDIF loads a deployment),
runs a request the way a server does (deserialize against its own modules, execute the block, return
what the block saved) and logs every request it receives, so a test can check that nothing but the
request was sent.

Like NDIF it is another process, and one that cannot import this project: it runs as a script (its own
folder, not the checkout, on its path; no PYTHONPATH), so what a trace needs from `analysis` must travel
in the request. It must not share the test's process: nnsight's client registers the checkout's packages
with cloudpickle to be shipped by value, and cloudpickle rebuilds a class shipped by value into the live
class of the same name when the unpickling process is the one that pickled it (its class tracker), so an
in-process server rewrote `analysis`'s classes with methods compiled from the shipped source.

`FakeNdif` (the test's side) starts the process and reads what it received through the private
GET /_log (DELETE /_log empties it); neither is logged.
"""
from __future__ import annotations

import base64
import email.parser
import io
import itertools
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

START_TIMEOUT_S = 300  # importing torch, transformers and nnsight and loading the model, on a busy machine


@dataclass
class Received:
    method: str
    path: str
    headers: dict
    body: bytes = b""
    fields: dict = field(default_factory=dict)  # multipart parts by name
    payload: dict = field(default_factory=dict)  # a POST /request's trace as the server read it

    def to_json(self) -> dict:
        data = dict(method=self.method, path=self.path, headers=self.headers, payload=self.payload)
        data["body"] = base64.b64encode(self.body).decode()
        data["fields"] = {k: base64.b64encode(v).decode() for k, v in self.fields.items()}
        return data

    @classmethod
    def from_json(cls, data: dict) -> "Received":
        return cls(data["method"], data["path"], data["headers"], base64.b64decode(data["body"]),
                   {k: base64.b64decode(v) for k, v in data["fields"].items()}, data["payload"])


# ---------------------------------------------------------------------------------------------
# The test's side


class FakeNdif:
    """`with FakeNdif(key, {model key: model folder}) as server:` a server process at `server.host`."""

    def __init__(self, key: str, hosted: dict) -> None:
        self.settings = {"key": key, "hosted": {k: str(Path(v).resolve()) for k, v in hosted.items()}}
        self.process: subprocess.Popen | None = None
        self.host = ""
        self._stderr = tempfile.TemporaryFile()

    def __enter__(self) -> "FakeNdif":
        from analysis.framework import paths  # the test's side only: the server cannot import analysis

        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        # one torch thread, as the tests' own side runs (tests/service/test_ndif_remote.py): a float32 matmul
        # split over another number of threads sums in another order and differs in the last bits
        env["OMP_NUM_THREADS"] = "1"
        self.process = subprocess.Popen(
            [sys.executable, str(paths.TESTS / "service" / "fake_ndif.py"), json.dumps(self.settings)],
            stdout=subprocess.PIPE, stderr=self._stderr, env=env, cwd=tempfile.gettempdir(), text=True)
        ready, _, _ = select.select([self.process.stdout], [], [], START_TIMEOUT_S)
        line = self.process.stdout.readline() if ready else ""
        if not line.startswith("port "):
            self.__exit__()
            self._stderr.seek(0)
            raise RuntimeError("the NDIF stand-in did not start:\n" + self._stderr.read().decode()[-3000:])
        self.host = f"http://127.0.0.1:{int(line.split()[1])}"
        return self

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._stderr.close()

    def _call(self, method: str, path: str) -> bytes:
        connection = HTTPConnection(self.host.removeprefix("http://"), timeout=60)
        try:
            connection.request(method, path)
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        if response.status != 200:
            raise RuntimeError(f"{method} {path}: HTTP {response.status}")
        return body

    @property
    def log(self) -> list[Received]:
        """Every request the server received since the last `clear_log()`, in order."""
        return [Received.from_json(r) for r in json.loads(self._call("GET", "/_log"))]

    def clear_log(self) -> None:
        self._call("DELETE", "/_log")


# ---------------------------------------------------------------------------------------------
# The server's side (this file run as a script)


class Server:
    def __init__(self, key: str, hosted: dict) -> None:
        import nnsight
        import torch
        from transformers import AutoModelForCausalLM

        self.key = key
        self.models = {}
        for model_key, folder in hosted.items():
            module = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False, use_safetensors=True,
                                                          attn_implementation="eager", dtype=torch.float32).eval()
            envoy = nnsight.NNsight(module)
            objects = {"Interleaver": envoy.interleaver}
            objects.update({f"Module:{e.path}": e._module for e in envoy.modules()})
            self.models[model_key] = objects
        self.log: list[Received] = []
        self.jobs: dict[str, dict] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.host = f"http://127.0.0.1:{self.http.server_address[1]}"

    def payload(self, envelope: dict, blob: bytes) -> dict:
        """The trace as a server reads it: the block's source, the globals and locals it ships (by name:
        type, and the value of a plain or empty one)."""
        import zstandard
        from nnsight.intervention.serialization import loads

        raw = zstandard.ZstdDecompressor().decompress(blob) if envelope["compress"] else blob
        _, (source, used_globals, used_locals) = loads(raw, self.models[envelope["model_key"]])

        def describe(value) -> dict:
            plain = value is None or isinstance(value, (bool, int, float, str)) or (
                isinstance(value, (dict, list, tuple)) and not value)
            return {"type": type(value).__qualname__, **({"repr": repr(value)} if plain else {})}

        return {"source": source, "globals": {k: describe(v) for k, v in used_globals.items()},
                "locals": {k: describe(v) for k, v in used_locals.items()}}

    def execute(self, envelope: dict, blob: bytes) -> bytes:
        import torch
        import zstandard
        from nnsight.schema.request import RequestModel
        from nnsight.tracing.tracer import _saves, dec, inc

        tracer = RequestModel.deserialize(blob, self.models[envelope["model_key"]], compress=envelope["compress"])
        inc()
        try:
            tracer.execute(tracer.info.code)
            saved = set(_saves())
        finally:
            dec()
        buffer = io.BytesIO()  # what the block saved goes back; the rest of its scope stays here
        torch.save({k: v for k, v in tracer.info.frame.f_locals.items() if id(v) in saved}, buffer)
        data = buffer.getvalue()
        return zstandard.ZstdCompressor().compress(data) if envelope["compress"] else data

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _reply(self, code: int, body: bytes | dict | list, kind: str = "application/json") -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _received(self) -> Received:
                length = int(self.headers.get("Content-Length") or 0)
                got = Received(self.command, self.path, dict(self.headers.items()), self.rfile.read(length))
                if got.body and "multipart" in self.headers.get("Content-Type", ""):
                    raw = f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode() + got.body
                    message = email.parser.BytesParser().parsebytes(raw)
                    got.fields = {part.get_param("name", header="content-disposition"): part.get_payload(decode=True)
                                  for part in message.get_payload()}
                with fake._lock:
                    fake.log.append(got)
                return got

            def _key_ok(self) -> bool:
                if self.headers.get("ndif-api-key") != fake.key:
                    self._reply(401, {"detail": "Invalid or missing API key."})
                    return False
                return True

            def do_DELETE(self) -> None:
                if self.path == "/_log":
                    with fake._lock:
                        fake.log.clear()
                    self._reply(200, {})
                else:
                    self._reply(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                got = self._received()
                if self.path != "/request" or not self._key_ok():
                    return
                envelope = json.loads(got.fields["data"])
                if envelope["model_key"] not in fake.models:
                    self._reply(404, {"detail": f"Model {envelope['model_key']} is not deployed on this NDIF."})
                    return
                job = str(next(fake._ids))
                try:
                    got.payload = fake.payload(envelope, got.fields["blob"])
                    fake.jobs[job] = {"result": fake.execute(envelope, got.fields["blob"]), "polls": 0}
                except Exception as exc:  # the server reports a failed job on its status (its log: why)
                    traceback.print_exc()
                    fake.jobs[job] = {"error": f"{type(exc).__name__}: {exc}", "polls": 0}
                self._reply(200, {"id": job, "status": "RECEIVED"})

            def do_GET(self) -> None:
                if self.path == "/_log":  # the test's view of what arrived; not itself logged
                    with fake._lock:
                        self._reply(200, [r.to_json() for r in fake.log])
                    return
                self._received()
                kind, _, job = self.path.strip("/").partition("/")
                if kind == "result" and job in fake.jobs:  # a presigned download: no key
                    self._reply(200, fake.jobs[job]["result"], "application/octet-stream")
                    return
                if kind != "response" or not self._key_ok():
                    return
                state = fake.jobs.get(job)
                if state is None:
                    self._reply(404, {"detail": "no such job"})
                    return
                state["polls"] += 1
                if state["polls"] == 1:
                    self._reply(200, {"id": job, "status": "RUNNING"})
                elif "error" in state:
                    self._reply(200, {"id": job, "status": "ERROR", "description": state["error"]})
                else:
                    self._reply(200, {"id": job, "status": "COMPLETED", "data": f"{fake.host}/result/{job}"})

        return Handler


def main(settings: str) -> None:
    import importlib.util

    if importlib.util.find_spec("analysis") is not None:  # NDIF has none of this project's code
        sys.exit("the NDIF stand-in can import this project's `analysis`: start it as a script, without PYTHONPATH")
    config = json.loads(settings)
    server = Server(config["key"], config["hosted"])
    print(f"port {server.http.server_address[1]}", flush=True)
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    server.http.serve_forever()


def _exit_with_parent() -> None:
    """End when the test process is gone (its pipe to our stdout closes), should it die without __exit__."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
