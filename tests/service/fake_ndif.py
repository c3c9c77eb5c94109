"""A local stand-in for the NDIF endpoint nnsight's non-blocking remote backend talks to.

POST /request (multipart: `data` = the JSON envelope, `blob` = the serialized trace), GET /response/<id>
(a job's status; RUNNING once, then COMPLETED with a download address), GET /result/<id> (the saves,
torch.save'd and zstd-compressed as the request asked). It checks the `ndif-api-key` header, hosts the
model keys it is given (each an nnsight-wrapped local model), runs a request the way a server does
(deserialize against its own modules, execute the block, return what the block saved) and logs every
request it receives, so a test can check that nothing but the request was sent.
"""
from __future__ import annotations

import email.parser
import io
import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    method: str
    path: str
    headers: dict
    body: bytes = b""
    fields: dict = field(default_factory=dict)  # multipart parts by name


class FakeNdif:
    def __init__(self, key: str, hosted: dict) -> None:
        """`hosted`: model key -> torch model this server runs requests on."""
        import nnsight

        self.key = key
        self.models = {}
        for model_key, module in hosted.items():
            envoy = nnsight.NNsight(module)
            objects = {"Interleaver": envoy.interleaver}
            objects.update({f"Module:{e.path}": e._module for e in envoy.modules()})
            self.models[model_key] = objects
        self.log: list[Received] = []
        self.jobs: dict[str, dict] = {}
        self._ids = itertools.count(1)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.host = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeNdif":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- what a server does with a request ----------------------------------------------------

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

            def _reply(self, code: int, body: bytes | dict, kind: str = "application/json") -> None:
                data = json.dumps(body).encode() if isinstance(body, dict) else body
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
                fake.log.append(got)
                return got

            def _key_ok(self) -> bool:
                if self.headers.get("ndif-api-key") != fake.key:
                    self._reply(401, {"detail": "Invalid or missing API key."})
                    return False
                return True

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
                    fake.jobs[job] = {"result": fake.execute(envelope, got.fields["blob"]), "polls": 0}
                except Exception as exc:  # the server reports a failed job on its status
                    fake.jobs[job] = {"error": f"{type(exc).__name__}: {exc}", "polls": 0}
                self._reply(200, {"id": job, "status": "RECEIVED"})

            def do_GET(self) -> None:
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
