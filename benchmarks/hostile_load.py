"""Hostile load: a public instance (deploy/public.toml, as shipped) under 20 clients for 60 s, a third of
them hostile, each client one person behind the same kind of reverse proxy (scripts/appending_proxy.py:
nginx's $proxy_add_x_forwarded_for).

    python benchmarks/hostile_load.py [--clients 20] [--hostile 7] [--seconds 60]

Normal viewers open the panels' default views and the gallery in turn (as scripts/load_test.py's
clients do), and every fourth step start a real run of their own (a KV view with a seed nobody used:
nothing cached). Hostile clients cycle through the attacks, each in a new session:
- spoofed: a new view (a fresh KV seed) with a forged X-Forwarded-For, as if each were a new visitor
  (the hostile clients are one attacker at one address, in several tabs: their views share one budget);
- oversized run: a KV view estimated far above `limits.max_run_seconds`;
- zip bomb: 0.4 MB that unpack to 391 MB, through the SAE page's data uploader;
- oversized upload: 6 MB to the upload endpoint (the limit is 5) and files beyond `uploads.files`;
- injection link: `?model=zoo:` with Markdown links, images and bare URLs;
- folder zip: a small zip of 1,200 folders (each an inode), through the data uploader (#50);
- estimator: a sharpness sweep of 10,000 prompts per n, to make the server estimate (a refused
  estimate took 620 s and +518 MB, #50): refused, and how long the refusal took;
- largest run: the largest runs the memory and time gate let a visitor start
  (benchmarks/results/public_peak.json: a SmolLM2 logit lens on an own prompt, a SAE-V feature store);
- ipv6: a new view from one of 8 addresses of one IPv6 /64 (a second attacker: one visitor, its own budget);
- many tabs: 8 sessions at once, a 1 MB file uploaded in each (the in-memory bound is per visitor);
- data injection: a data zip whose captions hold Markdown and HTML, then its link
  (`&data=upload:<sha>&view=ranking`) opened by a victim (another visitor): shown as text;
- token identity: a new view with identity headers and `?user=alice` (no name is an identity);
- two runs one model: two tabs start real runs on one model at once (one waits for the other).

Measured: errors of the normal viewers (an exception, an error box, a run that does not finish) and
their latency; for each attack, how many requests got the instance's refusal (or, for data injection, showed
the data as text), how many ran within the allowed budget (6 views per person per minute: the attacker's
runs together, the IPv6 attacker's apart) and how many did anything else (must be 0); the server's resident
memory beside `limits.server_mb` and the disk its uploads take, sampled each second, as the peak of each
third of the run. Writes benchmarks/results/hostile_load.json.
Not a timed test: the figures are this machine's (docs/deploy.md quotes them with the command).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import itertools
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout first
from analysis.framework.paths import DEPLOY, ROOT, SCRIPTS, result_file  # noqa: E402

sys.path.insert(0, str(SCRIPTS))
import load_test  # noqa: E402
import screenshot  # noqa: E402
from appending_proxy import AppendingProxy  # noqa: E402

SAE_PAGE = ("sae-features", "model=zoo:shapes-vlm")
NORMAL_PAGES = [p for p in load_test.PAGES]
ATTACKS = ("spoofed", "oversized run", "zip bomb", "oversized upload", "injection link", "folder zip", "estimator",
           "largest run", "ipv6", "many tabs", "data injection", "token identity", "two runs one model")
BUDGETED = ("spoofed", "largest run", "token identity", "two runs one model")  # the attacker's own views
IPV6 = [f"2001:db8:77:1::{k:x}" for k in range(1, 9)]  # one /64: one visitor
SMOL = "zoo:smollm2-135m-instruct"
# What each attack's refusal says (the message a visitor is shown, or the HTTP status of the endpoint).
REFUSALS = {
    "spoofed": "views with new analyses in the last minute",
    "oversized run": "so it was not started",
    "zip bomb": "unpacked takes 391 MB",
    "oversized upload": "413",
    "injection link": "is not a zoo model",
    "folder zip": "holds too much",
    "estimator": "so it was not started",
}
# The upload endpoint's 413: the visitor's in-memory files (`uploads.files`, every tab together) are taken,
# by the attacker's other tabs: refused before the zip is read.
HELD_FULL = "upload status 413"
LIMITS = ("so it was not started", "views with new analyses in the last minute")  # a gate's refusal
RATE = REFUSALS["spoofed"]  # once the attacker's views are spent, every heavy request gets this first
MARKUP = "<img src=http://evil.example/h.png onerror=alert(1)> **bold** [x](http://evil.example/)"
INJECTION = ("**bold** [x](http://evil.example/) ![i](http://evil.example/i.png) https://evil.example "
             "<img src=http://evil.example/h.png>")


def zip_bomb(mb: int = 391) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        with zf.open("data/captions.jsonl", "w", force_zip64=True) as fh:
            for _ in range(mb):
                fh.write(b"\0" * 2**20)
    return buf.getvalue()


def folder_zip(folders: int = 1200) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(folders):
            zf.writestr(f"d{i}/x.txt", b"")
    return buf.getvalue()


def markup_zip() -> bytes:
    """A data zip whose captions carry Markdown and HTML (its rows rank on the demo VLM)."""
    from PIL import Image

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        lines = []
        for i in range(6):
            image = io.BytesIO()
            Image.new("RGB", (32, 32), (40 * i, 200 - 30 * i, 90)).save(image, format="PNG")
            zf.writestr(f"img{i}.png", image.getvalue())
            lines.append({"image": f"img{i}.png", "caption": f"a red square {MARKUP} {i}"})
        zf.writestr("captions.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    return buf.getvalue()


def largest_runs() -> list[tuple[str, str]]:
    """The largest runs the gate starts in a process that holds the models (benchmarks/public_peak.py), as
    links; the server, which holds more (Streamlit, sessions), may refuse some with its budget's message."""
    sizes = {"residual": 96, "sae-v": 745, "inversion": 270}
    found = result_file("public_peak.json")
    if found.is_file():
        sizes |= {r["case"]: r["size"] for r in json.loads(found.read_text())["rows"] if r["case"] in sizes}
    sentence = "When Mary and John went to the store, John gave a drink to "
    text = (sentence * 4)[:sizes["residual"]].rsplit(" ", 1)[0] + " "
    return [("residual-stream", "model=" + SMOL + "&view=lens&pair=own&prompt=" + quote(text)
             + "&corrupt=" + quote(text.replace("John", "Anna")) + "&answer=" + quote(" Mary")),
            ("sae-features", f"model=zoo:shapes-vlm&data=dataset:shapes&store_pairs={sizes['sae-v']}"),
            ("prompt-reconstruction", f"model={SMOL}&prompt=" + quote((sentence * 6)[:sizes["inversion"]].strip()))]


def live_text_markup(run: load_test.Run) -> bool:
    """Markup of the attacker's left unescaped in any Markdown body or alert (escaped: a backslash before)."""
    bodies = list(run.markdown) + [b for _, b in run.alerts]
    return any(re.search(r"(?<!\\)<img|(?<!\\)\*\*bold|(?<!\\)\]\(http", b) for b in bodies)


def gated(run: load_test.Run) -> bool:
    """The run was refused or held by a limit, with the limit's message."""
    return any(text in plain(run) for text in LIMITS)


def view(client: load_test.ProtocolClient, page: str, query: str = "") -> load_test.Run:
    """Open a view and, where the page asks before a long run ("Run it (about ...)"), press Run, as a visitor
    who wants the analysis does. The button's label carries the estimate, and with it the button's id: on a
    crowded machine the estimate can change between two script runs and the press miss, so press up to 3 times."""
    run = client.run(page, query)
    for _ in range(3):
        go = next((i for i, (t, el) in run.elements.items() if t == "button" and el.label.startswith("Run it")), None)
        if go is None:
            return run
        run = client.run(page, query, [load_test.WidgetState(id=go, trigger_value=True)])
    return run


def ran_or_gated(run: load_test.Run) -> str:
    asks = any(t == "button" and el.label.startswith("Run it") for t, el in run.elements.values())
    if run.exceptions or run.errors() or (asks and not gated(run)):  # an error, or still not started
        return "other"
    return "refused" if gated(run) else "ran"


def plain(run: load_test.Run) -> str:
    return " | ".join(b for _, b in run.alerts).replace("\\", "").replace("\u2060", "")


def live_markup(run: load_test.Run) -> bool:
    return any(re.search(r"(?<!\\)\]\((?!\\)|(?<!\\)!\[", b) for _, b in run.alerts)


def start_server(tmp: Path) -> tuple[subprocess.Popen, int, Path]:
    cache = tmp / "cache"
    env = {**os.environ, "MODEL_INSPECTOR_CONFIG": str(DEPLOY / "public.toml"),
           "MODEL_INSPECTOR_STORE": str(tmp / "analyses.db"), "MODEL_INSPECTOR_CACHE": str(cache),
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("HF_HUB_OFFLINE", None)  # serve.py sets it itself: the public example has no Hub source
    port = screenshot.free_port()
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "serve.py"), "--server.port", str(port),
                             "--server.address", "127.0.0.1", "--server.headless", "true"], cwd=ROOT, env=env,
                            stdout=(tmp / "server.log").open("w"), stderr=subprocess.STDOUT)
    screenshot.wait_healthy(proc, port, timeout_s=300, poll_s=0.5, what="the public server")
    return proc, port, cache / "sae" / "uploads"


def disk_bytes(folder: Path) -> int:
    if not folder.exists():
        return 0
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.normal_requests = 0
        self.normal_errors: list[str] = []
        self.latencies: list[float] = []
        self.normal_real_runs = {"ran": 0, "refused": 0, "other": 0}
        self.estimator_seconds: list[float] = []
        self.events: list[tuple] = []
        self.t0 = time.perf_counter()
        self.attacks = {a: {"requests": 0, "refused": 0, "ran": 0, "other": 0, "samples": []} for a in ATTACKS}

    def attack(self, kind: str, outcome: str, note: str = "") -> None:
        with self.lock:
            # when each attack ended and how (beside the memory timeline: which runs made a peak)
            self.events.append((round(time.perf_counter() - self.t0, 1), kind, outcome, note[:80]))
            entry = self.attacks[kind]
            entry["requests"] += 1
            entry[outcome] += 1
            if outcome == "other" and len(entry["samples"]) < 5:
                entry["samples"].append(note[:300])


def normal_viewer(c: int, base: str, end_at: float, tally: Tally, seeds) -> None:
    step = c
    session = load_test.ProtocolClient(base, timeout_s=300)
    try:
        while time.perf_counter() < end_at:
            page, query = NORMAL_PAGES[step % len(NORMAL_PAGES)]
            real = step % 4 == 0
            if real:  # a real run of their own: a view nobody has computed
                page, query = "kv-cache", f"context=48&budget=16&new_tokens=2&seed={next(seeds)}"
            try:
                run = view(session, page, query)
            except Exception as exc:  # noqa: BLE001 (counted, not raised from a thread)
                with tally.lock:
                    tally.normal_requests += 1
                    tally.normal_errors.append(f"viewer {c} {page}: {type(exc).__name__}: {exc}")
                session.close()
                session = load_test.ProtocolClient(base, timeout_s=300)
            else:
                with tally.lock:
                    tally.normal_requests += 1
                    tally.latencies.append(run.seconds)
                    tally.normal_errors.extend(f"viewer {c} {page}: {e}" for e in run.errors())
                    if real:  # ran, or refused by a limit with its message (the machine's speed decides)
                        tally.normal_real_runs[ran_or_gated(run)] += 1
                        tally.events.append((round(time.perf_counter() - tally.t0, 1), "normal real run",
                                             ran_or_gated(run), f"{run.seconds:.0f} s"))
            step += 1
    finally:
        session.close()


def hostile_client(c: int, base: str, end_at: float, tally: Tally, bomb: bytes, seeds, extra: dict) -> None:
    rng = random.Random(c)
    step = c  # client c tries attacks c, c + 7, c + 14, ...: 7 clients cover all 13 in their first two
    while time.perf_counter() < end_at:
        kind = ATTACKS[step % len(ATTACKS)]
        forged = {"X-Forwarded-For": f"{rng.randrange(1, 224)}.{rng.randrange(256)}.{rng.randrange(256)}.1"}
        if kind in ("ipv6", "many tabs", "data injection", "token identity", "two runs one model", "largest run",
                    "folder zip", "estimator"):
            try:
                _new_attack(kind, c, base, tally, seeds, extra, step)
            except Exception as exc:  # noqa: BLE001
                tally.attack(kind, "other", f"{type(exc).__name__}: {exc}")
            step += extra["hostile"]
            continue
        try:
            client = load_test.ProtocolClient(base, timeout_s=300, headers=forged)
        except Exception as exc:  # noqa: BLE001
            tally.attack(kind, "other", f"connect: {exc}")
            step += extra["hostile"]
            continue
        try:
            if kind == "spoofed":
                run = view(client, "kv-cache", f"context=64&budget=16&new_tokens=4&seed={next(seeds)}")
                outcome = "refused" if REFUSALS[kind] in plain(run) else ("other" if run.errors() else "ran")
                tally.attack(kind, outcome, plain(run) + " ".join(run.errors()))
            elif kind == "oversized run":
                # about 1.7 h on SmolLM2 on a 2-core machine; the cap is 2 min (the default view's `examples`
                # is not read: the budget sweep's alone, drawn on demand)
                run = client.run("kv-cache", f"model={SMOL}&context=4096")
                ok = (REFUSALS[kind] in plain(run) or RATE in plain(run)) and not run.exceptions
                tally.attack(kind, "refused" if ok else "other", plain(run))
            elif kind == "zip bomb":
                run = _use_zip(client, bomb, f"bomb{c}.zip")
                ok = (REFUSALS[kind] in plain(run) or HELD_FULL in plain(run)) and not run.exceptions
                tally.attack(kind, "refused" if ok else "other", plain(run))
            elif kind == "oversized upload":
                client.run(*SAE_PAGE)
                big = load_test.upload(base, client.session_id, b"\0" * (6 * 2**20), "big.bin")
                held = [load_test.upload(base, client.session_id, b"\0" * 2**20, f"f{i}.bin") for i in range(5)]
                # the visitor's files, every tab together: other tabs of the attacker may hold some now
                ok = big == 413 and held.count(204) <= 4 and set(held) <= {204, 413} and 413 in held
                tally.attack(kind, "refused" if ok else "other", f"6 MB: {big}, five files: {held}")
            else:
                run = client.run("home", "model=zoo:" + INJECTION)
                ok = REFUSALS[kind] in plain(run) and not live_markup(run) and not run.exceptions
                tally.attack(kind, "refused" if ok else "other", plain(run))
        except Exception as exc:  # noqa: BLE001
            tally.attack(kind, "other", f"{type(exc).__name__}: {exc}")
        finally:
            client.close()
        step += extra["hostile"]


def _new_attack(kind: str, c: int, base: str, tally: Tally, seeds, extra: dict, step: int) -> None:
    """The attacks of #50's second round; each opens its own sessions."""
    if kind == "ipv6":  # one of 8 addresses of one /64, each through its own proxy
        with _client(extra["ipv6"][step % len(IPV6)].base) as client:
            run = view(client, "kv-cache", f"context=64&budget=16&new_tokens=4&seed={next(seeds)}")
        tally.attack(kind, ran_or_gated(run), plain(run) + " ".join(run.errors()))
    elif kind == "many tabs":  # 8 tabs of one visitor, a 1 MB file each, held at once
        tabs = [load_test.ProtocolClient(base, timeout_s=300) for _ in range(8)]
        try:
            for tab in tabs:
                tab.run("home")
            held = [load_test.upload(base, tab.session_id, b"\1" * 2**20, f"tab{i}.bin") for i, tab in enumerate(tabs)]
        finally:
            for tab in tabs:
                tab.close()
        ok = held.count(204) <= 4 and set(held) <= {204, 413}
        tally.attack(kind, "refused" if ok else "other", f"8 tabs: {held}")
    elif kind == "folder zip":
        with _client(base) as client:
            run = _use_zip(client, extra["folders"], f"folders{c}.zip")
        ok = (REFUSALS[kind] in plain(run) or HELD_FULL in plain(run)) and not run.exceptions
        tally.attack(kind, "refused" if ok else "other", plain(run))
    elif kind == "estimator":  # a sweep estimated at hours: the estimate itself must stay cheap
        with _client(base) as client:
            run = client.run("attention-sharpness", f"ns=64,128,256&samples=10000&rules=adaptive&seed={next(seeds)}")
        ok = gated(run) and not run.exceptions
        tally.attack(kind, "refused" if ok else "other", f"{run.seconds:.1f} s: {plain(run)}")
        with tally.lock:
            tally.estimator_seconds.append(round(run.seconds, 2))
    elif kind == "largest run":
        page, query = extra["largest"][next(extra["turn"]) % len(extra["largest"])]
        with _client(base) as client:
            run = view(client, page, query)
        tally.attack(kind, ran_or_gated(run), f"{page} {run.seconds:.0f} s: " + plain(run) + " ".join(run.errors()))
    elif kind == "data injection":  # the attacker uploads, a victim opens the link
        with _client(base) as client:
            held = _use_zip(client, extra["markup"], "captions.zip")
        if held.exceptions or "holds too much" in plain(held):
            tally.attack(kind, "other", "upload: " + plain(held))
            return
        sha = hashlib.sha256(extra["markup"]).hexdigest()
        with _client(extra["victim"].base) as victim:
            run = view(victim, "sae-features", f"model=zoo:shapes-vlm&data=upload:{sha}&view=ranking&thr=0")
        shown = any("a red square" in b for b in run.markdown)
        ok = not live_text_markup(run) and not run.exceptions and (shown or gated(run))
        tally.attack(kind, "refused" if ok else "other", plain(run) + " | " + " | ".join(run.markdown)[:200])
    elif kind == "token identity":  # names and identity headers the server must not take for a visitor
        headers = {"X-Forwarded-User": f"alice{step}", "Remote-User": f"alice{step}", "X-Auth-Request-User": "bob"}
        with _client(base, headers) as client:
            run = view(client, "kv-cache", f"user=alice{step}&context=64&budget=16&new_tokens=4&seed={next(seeds)}")
        tally.attack(kind, ran_or_gated(run), plain(run) + " ".join(run.errors()))
    else:  # two runs one model: two tabs, real runs on one model at once
        runs: list = [None, None]

        def one(i: int) -> None:
            with _client(base) as client:
                runs[i] = view(client, "kv-cache", f"context=96&budget=24&new_tokens=8&seed={next(seeds)}")

        pair = [threading.Thread(target=one, args=(i,)) for i in range(2)]
        for t in pair:
            t.start()
        for t in pair:
            t.join()
        for run in runs:
            if run is None:
                tally.attack(kind, "other", "a tab's run raised")
            else:
                tally.attack(kind, ran_or_gated(run), plain(run) + " ".join(run.errors()))


@contextlib.contextmanager
def _client(base: str, headers: dict | None = None):
    client = load_test.ProtocolClient(base, timeout_s=300, headers=headers)
    try:
        yield client
    finally:
        client.close()


def _use_zip(client: load_test.ProtocolClient, data: bytes, name: str) -> load_test.Run:
    page = client.run(*SAE_PAGE)
    uploader = load_test.widget(page, "file_uploader", "sae_data_zip")
    file_id = str(uuid.uuid4())
    status = load_test.upload(client.base, client.session_id, data, name, file_id=file_id)
    if status not in (200, 204):
        return load_test.Run(0.0, alerts=[(0, f"upload status {status}")])
    state = load_test.uploader_state(uploader, file_id, name, len(data))
    held = client.run(*SAE_PAGE, [state])
    go = load_test.widget(held, "button", "sae_data_zip_go")
    if go is None:
        return held
    return client.run(*SAE_PAGE, [state, load_test.WidgetState(id=go, trigger_value=True)])


def thirds(samples: list[tuple[float, float]], seconds: float) -> list[float]:
    values = [v for t, v in samples if 0 <= t <= seconds]
    if len(values) < 6:
        return []
    n = len(values) // 3
    return [round(max(values[:n]), 1), round(max(values[n:2 * n]), 1), round(max(values[2 * n:]), 1)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--hostile", type=int, default=None, help="how many of them are hostile (default: a third)")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--out", default=str(result_file("hostile_load.json")))
    args = parser.parse_args()
    hostile = args.hostile if args.hostile is not None else round(args.clients / 3)
    from analysis.framework import config

    public = DEPLOY / "public.toml"
    server_mb = config.parse(public.read_text(), str(public)).limits.server_mb
    bomb = zip_bomb()
    seeds = iter(random.Random().sample(range(10_000, 10_000_000), 10_000))
    tmp = Path(tempfile.mkdtemp(prefix="mi-hostile-"))
    proc, port, uploads = start_server(tmp)
    # one proxy per person: each normal viewer is someone else; the hostile clients are one attacker
    proxies = [AppendingProxy(port, peer=f"203.0.113.{max(c, hostile - 1) + 1}") for c in range(args.clients)]
    extra = {"ipv6": [AppendingProxy(port, peer=a) for a in IPV6], "victim": AppendingProxy(port, peer="198.51.100.9"),
             "folders": folder_zip(), "markup": markup_zip(), "largest": largest_runs(), "turn": itertools.count(),
             "hostile": hostile}
    tally, memory, disk = Tally(), [], []
    stop = threading.Event()
    start_at = time.perf_counter() + 2
    end_at = start_at + args.seconds

    def sample() -> None:
        while not stop.is_set():
            t = round(time.perf_counter() - start_at, 1)
            memory.append((t, round(load_test.rss_mb(proc.pid), 1)))
            disk.append((t, round(disk_bytes(uploads) / 2**20, 2)))
            stop.wait(1.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    threads = []
    for c in range(args.clients):
        base = proxies[c].base
        if c < hostile:
            threads.append(threading.Thread(target=hostile_client, args=(c, base, end_at, tally, bomb, seeds, extra)))
        else:
            threads.append(threading.Thread(target=normal_viewer, args=(c, base, end_at, tally, seeds)))
    while time.perf_counter() < start_at:
        time.sleep(0.01)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    sampler.join()
    for proxy in proxies + extra["ipv6"] + [extra["victim"]]:
        proxy.close()
    proc.terminate()
    proc.wait(timeout=60)
    log = (tmp / "server.log").read_text(errors="replace").splitlines()
    # what the server logged for the errors a visitor saw redacted: each traceback's last line
    raised = [line.strip()[:300] for i, line in enumerate(log) if i and re.match(r"^\w[\w.]*(Error|Exception)\b", line)]
    lat = sorted(tally.latencies)
    result = {
        "command": "python benchmarks/hostile_load.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"), "machine_cpus": os.cpu_count(), "config": "deploy/public.toml",
        "clients": args.clients, "hostile": hostile, "seconds": args.seconds,
        "normal": {"requests": tally.normal_requests, "errors": len(tally.normal_errors),
                   "error_samples": tally.normal_errors[:10],
                   "latency_s": {"p50": round(statistics.median(lat), 2) if lat else None,
                                 "p95": round(lat[int(0.95 * (len(lat) - 1))], 2) if lat else None,
                                 "max": round(lat[-1], 2) if lat else None}},
        "attacks": tally.attacks,
        "hostile_other": sum(a["other"] for a in tally.attacks.values()),
        "server_log_exceptions": raised[:20],
        "rss_timeline_mb": [(t, v) for i, (t, v) in enumerate(memory) if i % 5 == 0 or v == max(x for _, x in memory)],
        "events": [(round(t - (start_at - tally.t0), 1), *rest) for t, *rest in tally.events],
        "normal_real_runs": tally.normal_real_runs,
        "estimator_refusal_s": {"max": max(tally.estimator_seconds, default=None), "all": tally.estimator_seconds},
        "rss_mb": {"start": memory[0][1] if memory else None, "thirds_peak": thirds(memory, args.seconds),
                   "peak": max((v for _, v in memory), default=None), "server_mb": server_mb},
        "upload_disk_mb": {"thirds_peak": thirds(disk, args.seconds), "end": disk[-1][1] if disk else None,
                           "limit_total": 500, "limit_per_visitor": 25},
    }
    budget = 6 * (args.seconds / 60 + 1)  # one person's views per minute, over the windows the run spans
    ran = sum(tally.attacks[a]["ran"] for a in BUDGETED)
    result["attackers_views_ran"] = {"one_address": ran, "ipv6_64": tally.attacks["ipv6"]["ran"], "budget": budget}
    result["within_one_persons_budget"] = ran <= budget and tally.attacks["ipv6"]["ran"] <= budget
    result["rss_under_budget"] = bool(memory) and result["rss_mb"]["peak"] <= server_mb
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    ok = (result["normal"]["errors"] == 0 and result["hostile_other"] == 0 and result["within_one_persons_budget"]
          and result["rss_under_budget"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
