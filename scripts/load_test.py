"""Load test: N protocol clients use one running server for S seconds; errors, latency, saves, memory.

    python scripts/load_test.py --url http://127.0.0.1:8501 [--clients 20] [--seconds 60] [--pid PID]

Each client is one browser session without a browser: a websocket speaking Streamlit's own protocol
(the BackMsg a browser sends on opening a page or changing a widget, then the ForwardMsgs until the
script run ends). Each client opens the panels' default views and the gallery in turn, and every
`--save-every`-th step saves the view it has open through the page's own share bar (open the bar, type
a title, press Save) and keeps the id the page confirms. A request is one script run; it is an error
when the run raises (an exception element), shows an error box, does not finish, or a save is not
confirmed. With `--pid` (the server's process id) the server's resident memory is sampled every
second. tests/browser/test_public_instance.py runs it against a server with the public configuration, and
checks every confirmed save in the database. Loopback only: it opens connections to `--url` and
nothing else.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field

# Imported once, here: importing protobuf modules from 20 threads at once races (partially initialised modules).
from streamlit.proto.Alert_pb2 import Alert
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from streamlit.proto.WidgetStates_pb2 import WidgetState
from websockets.sync.client import connect

# (page, query): what the clients open, in turn (each client starts at its own offset)
PAGES = [
    ("kv-cache", ""),
    ("home", ""),
    ("prompt-reconstruction", ""),
    ("saved-analyses", ""),
    ("attention-sharpness", ""),
    ("sae-features", "model=zoo:shapes-vlm"),
]
SAVABLE = {"kv-cache", "prompt-reconstruction", "attention-sharpness"}  # pages with a share bar on their default view


@dataclass
class Run:
    """One script run as the client saw it."""

    seconds: float
    elements: dict = field(default_factory=dict)  # widget id -> (element type, proto)
    blocks: dict = field(default_factory=dict)  # widget id -> block proto (expanders)
    alerts: list = field(default_factory=list)  # (format, body)
    exceptions: list = field(default_factory=list)
    headings: list = field(default_factory=list)
    markdown: list = field(default_factory=list)  # bodies of Markdown elements (st.markdown, st.caption)
    session_id: str = ""

    def errors(self) -> list[str]:
        return self.exceptions + [body for fmt, body in self.alerts if fmt == Alert.ERROR]


class ProtocolClient:
    """One session on a Streamlit server, driven over its websocket."""

    def __init__(self, base: str, timeout_s: float = 120, headers: dict | None = None) -> None:
        self.timeout_s = timeout_s
        self.base = base
        self.headers = dict(headers or {})  # sent with the websocket's request (X-Forwarded-For, as a proxy would)
        self._connection = connect(base.replace("http", "ws", 1) + "/_stcore/stream", subprotocols=["streamlit"],
                                   max_size=None, open_timeout=60, additional_headers=self.headers, proxy=None)
        self.ws = self._connection.__enter__()
        self.session_id = ""

    def close(self) -> None:
        self._connection.__exit__(None, None, None)

    def run(self, page: str, query: str = "", widgets: list | None = None) -> Run:
        msg = BackMsg()
        msg.rerun_script.query_string = query.lstrip("?")
        msg.rerun_script.page_name = page
        if widgets:
            msg.rerun_script.widget_states.widgets.extend(widgets)
        self.ws.send(msg.SerializeToString())
        t0 = time.perf_counter()
        deadline = t0 + self.timeout_s
        run = Run(0.0)
        while True:
            fm = ForwardMsg()
            fm.ParseFromString(self.ws.recv(timeout=max(0.1, deadline - time.perf_counter())))
            kind = fm.WhichOneof("type")
            if kind == "new_session":
                run = Run(0.0)
                if fm.new_session.HasField("initialize"):
                    self.session_id = fm.new_session.initialize.session_id
            elif kind == "delta":
                delta = fm.delta
                which = delta.WhichOneof("type")
                if which == "add_block" and delta.add_block.id:
                    run.blocks[delta.add_block.id] = delta.add_block
                elif which == "new_element":
                    el = delta.new_element
                    t = el.WhichOneof("type")
                    inner = getattr(el, t)
                    if getattr(inner, "id", ""):
                        run.elements[inner.id] = (t, inner)
                    if t == "alert":
                        run.alerts.append((inner.format, inner.body))
                    elif t == "exception":
                        run.exceptions.append(f"{inner.type}: {inner.message}")
                    elif t == "heading":
                        run.headings.append(inner.body)
                    elif t == "markdown":
                        run.markdown.append(inner.body)
            elif kind == "script_finished":
                if fm.script_finished == ForwardMsg.FINISHED_EARLY_FOR_RERUN:
                    continue  # st.rerun(): the next run follows on the same socket
                run.seconds = time.perf_counter() - t0
                run.session_id = self.session_id
                if fm.script_finished != ForwardMsg.FINISHED_SUCCESSFULLY:
                    run.exceptions.append(f"script run ended with status {fm.script_finished}")
                return run

    def save(self, page: str, query: str, title: str) -> tuple[str | None, list[Run]]:
        """Save the view through its share bar as a visitor does; (the confirmed id or None, the runs)."""
        import re

        def state(widget_id: str, **value) -> WidgetState:
            s = WidgetState(id=widget_id)
            for k, v in value.items():
                setattr(s, k, v)
            return s

        first = self.run(page, query)
        bar = [i for i, b in first.blocks.items() if b.HasField("expandable") and "Share" in b.expandable.label]
        if not bar:
            return None, [first]
        opened = self.run(page, query, [state(bar[0], bool_value=True)])
        title_box = [i for i, (t, _) in opened.elements.items() if t == "text_input" and i.endswith("_title")]
        submit = [i for i, (t, el) in opened.elements.items() if t == "button" and el.is_form_submitter]
        if not title_box or not submit:
            return None, [first, opened]
        saved = self.run(page, query, [state(bar[0], bool_value=True), state(title_box[0], string_value=title),
                                       state(submit[0], trigger_value=True)])
        for fmt, body in saved.alerts:
            found = re.search(r"saved-analyses\?id=([A-Za-z0-9_-]+)", body)
            if found and body.startswith("Saved"):
                return found.group(1), [first, opened, saved]
        return None, [first, opened, saved]


def xsrf_cookie(base: str) -> str:
    """The XSRF cookie the server sets with its health answer, as the browser gets it (uploads must
    send it back as X-Xsrftoken)."""
    with urllib.request.urlopen(base + "/_stcore/health", timeout=30) as response:
        for header in response.headers.get_all("Set-Cookie") or []:
            if header.startswith("_streamlit_xsrf="):
                return header.split(";")[0].split("=", 1)[1]
    return ""


def upload(base: str, session_id: str, data: bytes, name: str = "upload.png", chunked: bool = False,
           file_id: str | None = None, headers: dict | None = None) -> int:
    """PUT `data` to the server's upload endpoint as the file uploader does; the HTTP status. `file_id`:
    the id a widget state then names (`uploader_state`)."""
    import http.client
    import uuid

    token = xsrf_cookie(base)
    boundary = uuid.uuid4().hex
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    host = base.split("://", 1)[1]
    conn = http.client.HTTPConnection(host, timeout=120)
    path = f"/_stcore/upload_file/{session_id}/{file_id or uuid.uuid4()}"
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}", "X-Xsrftoken": token,
               "Cookie": f"_streamlit_xsrf={token}", **(headers or {})}
    try:
        if chunked:  # no Content-Length: the server must cut the stream itself
            def body():
                yield head
                for i in range(0, len(data), 1 << 20):
                    yield data[i:i + (1 << 20)]
                yield tail
            conn.request("PUT", path, body=body(), headers=headers, encode_chunked=True)
        else:
            conn.request("PUT", path, body=head + data + tail, headers=headers)
        return conn.getresponse().status
    except (ConnectionError, http.client.HTTPException):  # the server closed it mid-body: refused too
        return 413
    finally:
        conn.close()


def uploader_state(widget_id: str, file_id: str, name: str, size: int) -> WidgetState:
    """The widget state a browser sends once its file uploader holds the file PUT as `file_id`."""
    state = WidgetState(id=widget_id)
    info = state.file_uploader_state_value.uploaded_file_info.add()
    info.file_id, info.name, info.size = file_id, name, size
    return state


def widget(run: Run, kind: str, key: str) -> str | None:
    """The id of the widget of this type whose user key is `key` in a run (None: not drawn)."""
    return next((i for i, (t, _) in run.elements.items() if t == kind and i.endswith(key)), None)


def rss_mb(pid: int) -> float:
    import psutil

    proc = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20


def visitor_headers(c: int) -> dict:
    """Client `c` as its own visitor behind a trusted proxy (the server's `proxy_hops`): its X-Forwarded-For."""
    return {"X-Forwarded-For": f"10.77.{c // 250}.{c % 250 + 1}"}


def load_test(base: str, clients: int = 20, seconds: float = 60, pid: int | None = None, save_every: int = 4,
              pages: list[tuple[str, str]] | None = None, label: str = "load", visitors: bool = False) -> dict:
    """`visitors`: each client its own visitor (X-Forwarded-For), as people behind a proxy are; else every
    client is this machine's one visitor, and the per-visitor limits count them together."""
    pages = pages or PAGES
    lock = threading.Lock()
    latencies: list[float] = []
    slowest: dict[str, float] = {}  # page -> its slowest script run
    slow_runs: list[tuple] = []  # (seconds since start, client, page, open/save, run index, seconds) above 5 s
    errors: list[str] = []
    confirmed: list[str] = []
    requests = [0]
    memory: list[tuple[float, float]] = []
    stop = threading.Event()
    start_at = time.perf_counter() + 2  # every client connected first
    end_at = start_at + seconds

    def client(c: int) -> None:
        headers = visitor_headers(c) if visitors else None
        try:
            session = ProtocolClient(base, headers=headers)
        except Exception as exc:  # noqa: BLE001 (reported, not raised from a thread)
            with lock:
                errors.append(f"client {c}: connect: {type(exc).__name__}: {exc}")
            return
        step = c
        try:
            while time.perf_counter() < start_at:
                time.sleep(0.01)
            while time.perf_counter() < end_at:
                page, query = pages[step % len(pages)]
                try:
                    step_kind = "save" if page in SAVABLE and step % save_every == 0 else "open"
                    if step_kind == "save":
                        saved, runs = session.save(page, query, f"{label} client {c} step {step}")
                        problem = [] if saved else [f"{page}: save not confirmed"]
                    else:
                        saved, runs = None, [session.run(page, query)]
                        problem = []
                except Exception as exc:  # noqa: BLE001
                    with lock:
                        requests[0] += 1
                        errors.append(f"client {c} {page}: {type(exc).__name__}: {exc}")
                    session.close()
                    session = ProtocolClient(base, headers=headers)
                    step += 1
                    continue
                with lock:
                    requests[0] += len(runs)
                    latencies.extend(r.seconds for r in runs)
                    slowest[page] = round(max([slowest.get(page, 0.0)] + [r.seconds for r in runs]), 2)
                    slow_runs.extend((round(time.perf_counter() - start_at, 1), c, page, step_kind, i, round(r.seconds, 1))
                                     for i, r in enumerate(runs) if r.seconds > 5)
                    errors.extend(f"client {c} {page}: {e}" for r in runs for e in r.errors())
                    errors.extend(f"client {c}: {p}" for p in problem)
                    if saved:
                        confirmed.append(saved)
                step += 1
        finally:
            session.close()

    def sample() -> None:  # seconds since the clients started (negative: before), MB
        while not stop.is_set():
            memory.append((round(time.perf_counter() - start_at, 1), round(rss_mb(pid), 1)))
            stop.wait(1.0)

    sampler = threading.Thread(target=sample, daemon=True) if pid else None
    if sampler:
        sampler.start()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    if sampler:
        sampler.join()
    lat = sorted(latencies)
    return {
        "clients": clients, "seconds": seconds, "requests": requests[0], "errors": len(errors),
        "error_samples": errors[:10], "saves_confirmed": len(confirmed), "confirmed_ids": confirmed,
        "requests_per_s": round(requests[0] / seconds, 1),
        "latency_s": {"p50": round(statistics.median(lat), 3) if lat else None,
                      "p95": round(lat[int(0.95 * (len(lat) - 1))], 3) if lat else None,
                      "max": round(lat[-1], 3) if lat else None},
        "slowest_run_s_by_page": slowest, "runs_over_5_s": slow_runs[:20],
        "rss_mb": memory,
    }


def memory_growth(samples: list[tuple[float, float]], seconds: float) -> dict:
    """Peak RSS in each third of the loaded window (0 to `seconds`): memory that 'stops growing' has its
    last third's peak close to the middle third's (the first third includes warming caches)."""
    values = [mb for t, mb in samples if 0 <= t <= seconds]
    if len(values) < 6:
        return {"thirds_peak_mb": [], "last_minus_middle_mb": None}
    n = len(values) // 3
    thirds = [max(values[:n]), max(values[n:2 * n]), max(values[2 * n:])]
    return {"start_mb": values[0], "thirds_peak_mb": thirds, "last_minus_middle_mb": round(thirds[2] - thirds[1], 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the running server, e.g. http://127.0.0.1:8501")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--pid", type=int, default=None, help="the server's process id (memory samples)")
    parser.add_argument("--save-every", type=int, default=4)
    args = parser.parse_args()
    if not args.url.startswith(("http://127.0.0.1", "http://localhost", "http://[::1]")):
        print("error: the load test runs against a server on this machine only (http://127.0.0.1:PORT)",
              file=sys.stderr)
        return 2
    result = load_test(args.url.rstrip("/"), args.clients, args.seconds, args.pid, args.save_every)
    result["memory"] = memory_growth(result["rss_mb"], args.seconds)
    result.pop("confirmed_ids")
    print(json.dumps(result, indent=2))
    return 0 if result["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
