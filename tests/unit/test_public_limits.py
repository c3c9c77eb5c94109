"""The public instance's rules as plain logic (#39): who the visitor is behind proxies, a view's runs
counting once, a visitor's share of the run slots, the upload area's limits and expiry, a zip that is
refused leaving nothing, messages a visitor may see, and the configuration keys that guard them.
The same rules against a real server: tests/service/test_public_server.py."""
from __future__ import annotations

import io
import threading
import time
import zipfile
from pathlib import Path

import pytest

from analysis.framework import config as cfg
from analysis.framework import uploads
from analysis.framework.paths import DEPLOY
from analysis.framework.uploads import Quota, UploadArea, UploadRefused
from components.hosting import RateLimiter, client_address, escape_markdown
from components.limits import Slots

# ---------------------------------------------------------------------------------------------
# Who the visitor is


@pytest.mark.parametrize("peer,chain,hops,expected", [
    ("127.0.0.1", ["203.0.113.9"], 1, "203.0.113.9"),  # one proxy appended the visitor's address
    ("127.0.0.1", ["6.6.6.6", "203.0.113.9"], 1, "203.0.113.9"),  # what the visitor wrote is further left
    ("127.0.0.1", ["6.6.6.6", "203.0.113.9", "10.0.0.2"], 2, "203.0.113.9"),  # two proxies: the outer one's entry
    ("127.0.0.1", [], 1, "127.0.0.1"),  # no header: the connection's own address
    ("10.1.2.3", ["6.6.6.6"], 0, "10.1.2.3"),  # no trusted proxy: the header is the visitor's own writing
    ("8.8.8.8", ["203.0.113.9"], 1, "8.8.8.8"),  # a public peer came straight in: its header is ignored
    (None, ["203.0.113.9"], 1, "local"),  # no connection at all (AppTest): one visitor, never a session
])
def test_the_visitor_is_the_entry_the_trusted_proxy_added(peer, chain, hops, expected):
    assert client_address(peer, chain, hops) == expected


def test_a_views_several_runs_count_once():
    limiter = RateLimiter()
    assert [limiter.wait_s("v", 2, record=True, now=0, token="view-1") for _ in range(5)] == [0] * 5
    assert limiter.wait_s("v", 2, record=True, now=1, token="view-2") == 0
    assert limiter.wait_s("v", 2, record=True, now=2, token="view-3") == pytest.approx(58)
    assert limiter.wait_s("v", 2, record=True, now=3, token="view-2") == 0  # the view already counted
    assert [limiter.wait_s("w", 2, record=True, now=0) for _ in range(3)][-1] > 0  # no token: each counts


def test_one_visitor_holds_at_most_their_share_of_the_slots():
    """Two slots, one per visitor: A's second run waits although a slot is free; B's runs at once."""
    slots = Slots()
    assert slots.acquire(2, timeout=0.1, owner="a", share=1)
    got = []
    second = threading.Thread(target=lambda: got.append(slots.acquire(2, timeout=0.3, owner="a", share=1)))
    second.start()
    second.join()
    assert got == [False] and slots.blocked_by(2, "a", 1) == "mine"
    other = []
    t = threading.Thread(target=lambda: other.append(slots.acquire(2, timeout=0.3, owner="b", share=1)))
    t.start()
    t.join()
    assert other == [True] and slots.running == 2
    assert slots.blocked_by(2, "c", 1) == "all"


def test_slots_with_a_share_never_exceed_it_under_threads():
    slots, lock = Slots(), threading.Lock()
    running: dict[str, int] = {}
    peak: dict[str, int] = {}

    def worker(owner: str) -> None:
        while not slots.acquire(3, timeout=0.05, owner=owner, share=1):
            pass
        with lock:
            running[owner] = running.get(owner, 0) + 1
            peak[owner] = max(peak.get(owner, 0), running[owner])
        time.sleep(0.02)
        with lock:
            running[owner] -= 1
        slots.release()

    threads = [threading.Thread(target=worker, args=(o,)) for o in "aaaabbbbcc"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak == {"a": 1, "b": 1, "c": 1} and slots.peak <= 3 and slots.running == 0


# ---------------------------------------------------------------------------------------------
# The upload area


def test_the_upload_area_holds_count_bytes_and_total(tmp_path):
    mb = 2**20
    area = UploadArea(tmp_path, Quota(files=2, visitor_bytes=10 * mb, total_bytes=15 * mb, keep_s=0))
    area.add_file("a", b"x" * 4 * mb, "me")
    with pytest.raises(UploadRefused, match=r"takes 7 MB; 6 MB is left for it .*one visitor's uploads may take 10 MB"):
        area.add_file("b", b"x" * 7 * mb, "me")
    area.add_file("b", b"x" * 5 * mb, "me")
    with pytest.raises(UploadRefused, match=r"You have 2 uploads on this instance, the most one visitor may keep"):
        area.add_file("c", b"x", "me")
    area.add_file("d", b"x" * 5 * mb, "you")
    with pytest.raises(UploadRefused, match=r"takes 2 MB; 1 MB is left .*every visitor's together 15 MB"):
        area.add_file("e", b"x" * 2 * mb, "them")
    area.add_file("e", b"x" * mb, "them")
    with pytest.raises(UploadRefused, match=r"space for uploads \(15 MB for every visitor together\) is full"):
        area.add_file("f", b"x", "them")
    assert area.usage("me") == (2, 9 * mb) and area.usage() == (4, 15 * mb)
    assert not list(tmp_path.rglob("*.partial"))


def test_expired_uploads_and_stale_partials_are_swept_back_to_nothing(tmp_path):
    area = UploadArea(tmp_path, Quota(keep_s=10))
    area.add_file("a", b"x" * 100, "me")
    with area.writing("folder", "me") as (partial, _):
        partial.mkdir()
        (partial / "f.txt").write_text("y")
    (tmp_path / "old.partial").mkdir()  # a write that died with its process
    (tmp_path / "before-records").mkdir()  # an upload from before entries had records
    now = time.time()
    assert area.sweep(now + 5) == 0 and area.usage() == (2, 3 * uploads.BLOCK)  # a block per file and folder
    assert area.sweep(now + uploads.STALE_PARTIAL_S + 1) >= 4
    assert area.usage() == (0, 0) and area.disk_bytes() == 0 and list(tmp_path.iterdir()) == []


def test_a_failed_write_leaves_nothing(tmp_path):
    area = UploadArea(tmp_path, Quota(visitor_bytes=100))
    with pytest.raises(UploadRefused, match="Nothing was kept"):
        with area.writing("big", "me") as (partial, _):
            partial.write_bytes(b"x" * 200)  # more than the room it was given: measured after the block
    with pytest.raises(RuntimeError):
        with area.writing("broken", "me") as (partial, _):
            partial.mkdir()
            raise RuntimeError("the zip was cut")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture()
def upload_cache(monkeypatch, tmp_path):
    from analysis.sae_v import types

    monkeypatch.setattr(types, "CACHE_ROOT", tmp_path / "sae")
    config = tmp_path / "public.toml"
    config.write_text((DEPLOY / "public.toml").read_text())
    monkeypatch.setenv(cfg.CONFIG_ENV, str(config))
    return tmp_path / "sae" / "uploads"


def bomb(mb: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        with zf.open("d/captions.jsonl", "w", force_zip64=True) as fh:
            for _ in range(mb):
                fh.write(b"\0" * 2**20)
    return buf.getvalue()


def test_a_refused_zip_leaves_no_partial_folder(upload_cache):
    from analysis.sae_v import userdata

    with pytest.raises(UploadRefused, match=r"unpacked takes 60 MB; 25 MB is left"):
        userdata.save_zip(bomb(60), "'bomb.zip'", owner="ip:1.2.3.4")
    evil = io.BytesIO()
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("ok/captions.jsonl", "{}")
        zf.writestr("../escape.txt", "x")
    with pytest.raises(userdata.DataError, match="unsafe entry"):
        userdata.save_zip(evil.getvalue(), "'evil.zip'", owner="ip:1.2.3.4")
    with pytest.raises(userdata.DataError, match="zips up to 5 MB are accepted"):
        userdata.save_zip(b"PK" + b"\0" * (6 * 2**20), "'big.zip'")
    assert not upload_cache.exists() or [p for p in upload_cache.rglob("*") if p.is_file()] == []


def test_zips_and_images_share_one_visitors_limits(upload_cache):
    from PIL import Image

    from analysis.sae_v import userdata

    locators = [userdata.save_zip(_small_zip(i), f"'z{i}.zip'", owner="ip:v") for i in range(3)]
    pngs = []
    for colour in ((1, 2, 3), (4, 5, 6)):
        png = io.BytesIO()
        Image.new("RGB", (8, 8), colour).save(png, format="PNG")
        pngs.append(png.getvalue())
    userdata.save_image(pngs[0], "'a.png'", owner="ip:v")  # the fourth upload of this visitor
    with pytest.raises(UploadRefused, match="the most one visitor may keep at once"):
        userdata.save_image(pngs[1], "'b.png'", owner="ip:v")
    assert userdata.save_image(pngs[1], "'b.png'", owner="ip:w").startswith("sha:")  # another visitor's room
    assert len(set(locators)) == 3
    assert userdata.save_zip(_small_zip(0), "'z0.zip'", owner="ip:v") == locators[0]  # already there: no new entry


def _small_zip(i: int) -> bytes:
    """The same bytes for the same `i` (a fixed date: writestr stamps the current second otherwise, and a zip
    made again a second later is another upload)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(zipfile.ZipInfo("d/texts.txt", date_time=(2026, 1, 1, 0, 0, 0)), f"text {i}\n")
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------
# Messages a visitor sees; configuration keys


def test_escaped_text_has_no_link_image_or_bare_url_left():
    import re

    text = escape_markdown("**b** [x](http://e.example) ![i](http://e.example/i.png) https://e.example www.e.example "
                           "a@e.example <img src=x> :red[t]")
    assert not re.search(r"(?<!\\)[\[\]()*!<>]|https?://|www\.e|@e\.|(?<!\\):", text), text


def test_a_public_instance_hides_operator_instructions_and_server_paths(monkeypatch, tmp_path):
    from analysis.framework.paths import ROOT
    from components import hosting

    message = (f"'{ROOT / 'data'}' is outside the folders data may be read from ({ROOT}). Set MODEL_INSPECTOR_ROOTS "
               "to allow another folder. Try pip install -r requirements.txt first.")
    monkeypatch.setenv(cfg.CONFIG_ENV, str(ROOT / "deploy" / "public.toml"))
    shown = hosting.visible(message)
    assert str(ROOT) not in shown and "MODEL_INSPECTOR" not in shown and "pip install" not in shown
    assert shown.startswith("'[a server folder]' is outside the folders")
    local = tmp_path / "local.toml"
    local.write_text('name = "mine"\n')
    monkeypatch.setenv(cfg.CONFIG_ENV, str(local))
    assert hosting.visible(message) == message  # the person at the keyboard runs this server


def test_configuration_keys_of_a_public_instance():
    public = cfg.parse((DEPLOY / "public.toml").read_text())
    assert public.public and public.proxy_hops == 1 and public.read_only()
    assert public.limits.max_run_seconds and public.limits.visitor_runs == 1 and public.uploads.keep_seconds
    assert "Training is turned off" in public.training_refusal(signed_in=True)
    with pytest.raises(cfg.ConfigError, match="trust_proxy was replaced by proxy_hops"):
        cfg.parse("trust_proxy = true\n")
    with pytest.raises(cfg.ConfigError, match="limits.training must be one of"):
        cfg.parse('[limits]\ntraining = "anyone"\n')
    writable = cfg.parse('[limits]\ntraining = "signed-in"\n')
    assert writable.training_refusal(signed_in=False) and writable.training_refusal(signed_in=True) is None


@pytest.mark.parametrize("secrets,problem", [
    ({}, "no [auth] section"),
    ({"auth": {"redirect_uri": "r", "cookie_secret": "c", "client_id": "i"}}, "lack client_secret, server_metadata_url"),
    ({"auth": {"redirect_uri": "r", "cookie_secret": "c", "client_id": "i", "client_secret": "s",
               "server_metadata_url": "u"}}, None),
])
def test_oidc_needs_its_secrets(secrets, problem):
    config = cfg.parse('[auth]\nmode = "oidc"\n')
    found = cfg.oidc_problem(config, secrets)
    assert (found is None) if problem is None else (problem in found), found
    assert cfg.oidc_problem(cfg.parse(""), {}) is None
