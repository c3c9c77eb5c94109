"""Hostile load: a public instance (deploy/public.toml, as shipped) under 20 clients for 60 s, a third of
them hostile, each client one person behind the same kind of reverse proxy (scripts/appending_proxy.py:
nginx's $proxy_add_x_forwarded_for).

    python benchmarks/hostile_load.py [--clients 20] [--hostile 7] [--seconds 60]

Normal viewers open the panels' default views and the gallery in turn (as scripts/load_test.py's
clients do). Hostile clients cycle through five attacks, each in a new session:
- spoofed: a new view (a fresh KV seed) with a forged X-Forwarded-For, as if each were a new visitor
  (the hostile clients are one attacker at one address, in several tabs: their views share one budget);
- oversized run: a KV view estimated far above `limits.max_run_seconds`;
- zip bomb: 0.4 MB that unpack to 391 MB, through the SAE page's data uploader;
- oversized upload: 6 MB to the upload endpoint (the limit is 5) and a fifth file held by one session;
- injection link: `?model=zoo:` with Markdown links, images and bare URLs.

Measured: errors of the normal viewers (an exception, an error box, a run that does not finish) and
their latency; for each attack, how many requests got the instance's refusal message, how many ran
within the allowed budget (only spoofed views may: 6 views per person per minute) and how many did
anything else (must be 0); the server's resident memory and the disk its uploads take, sampled each
second, as the peak of each third of the run. Writes benchmarks/results/hostile_load.json.
Not a timed test: the figures are this machine's (docs/deploy.md quotes them with the command).
"""
from __future__ import annotations

import argparse
import io
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout first
from analysis.framework.paths import DEPLOY, ROOT, SCRIPTS, result_file  # noqa: E402

sys.path.insert(0, str(SCRIPTS))
import load_test  # noqa: E402
import screenshot  # noqa: E402
from appending_proxy import AppendingProxy  # noqa: E402

SAE_PAGE = ("sae-features", "model=zoo:shapes-vlm")
NORMAL_PAGES = [p for p in load_test.PAGES]
ATTACKS = ("spoofed", "oversized run", "zip bomb", "oversized upload", "injection link")
# What each attack's refusal says (the message a visitor is shown, or the HTTP status of the endpoint).
REFUSALS = {
    "spoofed": "views with new analyses in the last minute",
    "oversized run": "so it was not started",
    "zip bomb": "unpacked takes 391 MB",
    "oversized upload": "413",
    "injection link": "is not a zoo model",
}
RATE = REFUSALS["spoofed"]  # once the attacker's views are spent, every heavy request gets this first
INJECTION = ("**bold** [x](http://evil.example/) ![i](http://evil.example/i.png) https://evil.example "
             "<img src=http://evil.example/h.png>")


def zip_bomb(mb: int = 391) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        with zf.open("data/captions.jsonl", "w", force_zip64=True) as fh:
            for _ in range(mb):
                fh.write(b"\0" * 2**20)
    return buf.getvalue()


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
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
        self.attacks = {a: {"requests": 0, "refused": 0, "ran": 0, "other": 0, "samples": []} for a in ATTACKS}

    def attack(self, kind: str, outcome: str, note: str = "") -> None:
        with self.lock:
            entry = self.attacks[kind]
            entry["requests"] += 1
            entry[outcome] += 1
            if outcome == "other" and len(entry["samples"]) < 5:
                entry["samples"].append(note[:300])


def normal_viewer(c: int, base: str, end_at: float, tally: Tally) -> None:
    step = c
    session = load_test.ProtocolClient(base)
    try:
        while time.perf_counter() < end_at:
            page, query = NORMAL_PAGES[step % len(NORMAL_PAGES)]
            try:
                run = session.run(page, query)
            except Exception as exc:  # noqa: BLE001 (counted, not raised from a thread)
                with tally.lock:
                    tally.normal_requests += 1
                    tally.normal_errors.append(f"viewer {c} {page}: {type(exc).__name__}: {exc}")
                session.close()
                session = load_test.ProtocolClient(base)
            else:
                with tally.lock:
                    tally.normal_requests += 1
                    tally.latencies.append(run.seconds)
                    tally.normal_errors.extend(f"viewer {c} {page}: {e}" for e in run.errors())
            step += 1
    finally:
        session.close()


def hostile_client(c: int, base: str, end_at: float, tally: Tally, bomb: bytes, seeds) -> None:
    rng = random.Random(c)
    step = c
    while time.perf_counter() < end_at:
        kind = ATTACKS[step % len(ATTACKS)]
        forged = {"X-Forwarded-For": f"{rng.randrange(1, 224)}.{rng.randrange(256)}.{rng.randrange(256)}.1"}
        try:
            client = load_test.ProtocolClient(base, timeout_s=300, headers=forged)
        except Exception as exc:  # noqa: BLE001
            tally.attack(kind, "other", f"connect: {exc}")
            step += 1
            continue
        try:
            if kind == "spoofed":
                run = client.run("kv-cache", f"context=64&budget=16&new_tokens=4&seed={next(seeds)}")
                outcome = "refused" if REFUSALS[kind] in plain(run) else ("other" if run.errors() else "ran")
                tally.attack(kind, outcome, plain(run) + " ".join(run.errors()))
            elif kind == "oversized run":
                run = client.run("kv-cache", "examples=200")  # about 45 min on a 2-core machine; the cap is 2
                ok = (REFUSALS[kind] in plain(run) or RATE in plain(run)) and not run.exceptions
                tally.attack(kind, "refused" if ok else "other", plain(run))
            elif kind == "zip bomb":
                run = _use_zip(client, bomb, f"bomb{c}.zip")
                ok = REFUSALS[kind] in plain(run) and not run.exceptions
                tally.attack(kind, "refused" if ok else "other", plain(run))
            elif kind == "oversized upload":
                client.run(*SAE_PAGE)
                big = load_test.upload(base, client.session_id, b"\0" * (6 * 2**20), "big.bin")
                held = [load_test.upload(base, client.session_id, b"\0" * 2**20, f"f{i}.bin") for i in range(5)]
                ok = big == 413 and held == [204] * 4 + [413]
                tally.attack(kind, "refused" if ok else "other", f"6 MB: {big}, five files: {held}")
            else:
                run = client.run("home", "model=zoo:" + INJECTION)
                ok = REFUSALS[kind] in plain(run) and not live_markup(run) and not run.exceptions
                tally.attack(kind, "refused" if ok else "other", plain(run))
        except Exception as exc:  # noqa: BLE001
            tally.attack(kind, "other", f"{type(exc).__name__}: {exc}")
        finally:
            client.close()
        step += 1


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
    bomb = zip_bomb()
    seeds = iter(random.Random().sample(range(10_000, 10_000_000), 10_000))
    tmp = Path(tempfile.mkdtemp(prefix="mi-hostile-"))
    proc, port, uploads = start_server(tmp)
    # one proxy per person: each normal viewer is someone else; the hostile clients are one attacker
    proxies = [AppendingProxy(port, peer=f"203.0.113.{max(c, hostile - 1) + 1}") for c in range(args.clients)]
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
            threads.append(threading.Thread(target=hostile_client, args=(c, base, end_at, tally, bomb, seeds)))
        else:
            threads.append(threading.Thread(target=normal_viewer, args=(c, base, end_at, tally)))
    while time.perf_counter() < start_at:
        time.sleep(0.01)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    sampler.join()
    for proxy in proxies:
        proxy.close()
    proc.terminate()
    proc.wait(timeout=60)
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
        "rss_mb": {"start": memory[0][1] if memory else None, "thirds_peak": thirds(memory, args.seconds)},
        "upload_disk_mb": {"thirds_peak": thirds(disk, args.seconds), "end": disk[-1][1] if disk else None,
                           "limit_total": 500, "limit_per_visitor": 25},
    }
    spoofed = tally.attacks["spoofed"]
    budget = 6 * (args.seconds / 60 + 1)  # one person's views per minute, over the windows the run spans
    result["spoofed_within_one_persons_budget"] = spoofed["ran"] <= budget
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    ok = result["normal"]["errors"] == 0 and result["hostile_other"] == 0 and spoofed["ran"] <= budget
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
