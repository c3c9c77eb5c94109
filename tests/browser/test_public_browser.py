"""The public example in Chromium, through a reverse proxy that appends to X-Forwarded-For (#39): a hostile
link and a hostile saved analysis render as plain text, and the browser contacts no host but the app's.
The server is tests/public_instance.py's (shared with tests/service/test_public_server.py when both run
in one process); every request the page makes is recorded, and anything not for the app is refused."""
from __future__ import annotations

import sys
from urllib.parse import quote, urlsplit

import pytest

import public_instance
from analysis.model_access.models import zoo_models
from analysis.hosting.store import SavedAnalysis, open_store
from public_instance import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import screenshot  # noqa: E402

pytestmark = [pytest.mark.skipif("shapes-lm" not in zoo_models(), reason="needs the demo zoo"),
              public_instance.ON_SHARED_SERVER]
EVIL = "evil.example"
HOSTILE_TEXT = (f"**bold** [link](http://{EVIL}/l) ![img](http://{EVIL}/i.png) https://{EVIL}/bare www.{EVIL} "
                f"me@{EVIL} <img src=http://{EVIL}/h.png> :red[red]")


@pytest.fixture(scope="module")
def browser_page(chromium):
    server = public_instance.shared()
    proxy = server.proxy(peer="203.0.113.50")
    requests: list[str] = []
    context = chromium.new_context(viewport={"width": 1200, "height": 900})  # the process's Chromium
    ours = urlsplit(proxy.base).netloc

    def guard(route):
        requests.append(route.request.url)
        if urlsplit(route.request.url).netloc == ours or route.request.url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            route.abort()

    context.route("**/*", guard)
    context.on("websocket", lambda ws: requests.append(ws.url))
    page = context.new_page()
    yield server, proxy, page, requests
    context.close()


def foreign(requests: list[str], base: str) -> list[str]:
    netloc = urlsplit(base).netloc
    return [u for u in requests if urlsplit(u).netloc != netloc and not u.startswith(("data:", "blob:"))]


def no_live_markup(page) -> None:
    links = page.evaluate(f"() => [...document.querySelectorAll('a[href]')].map(a => a.href)"
                          f".filter(h => h.includes('{EVIL}'))")
    images = page.evaluate(f"() => [...document.querySelectorAll('img[src]')].map(i => i.src)"
                           f".filter(s => s.includes('{EVIL}'))")
    bold = page.evaluate("() => [...document.querySelectorAll('strong, em')].map(s => s.innerText)"
                         ".filter(t => t.trim() === 'bold')")  # the visitor's **bold** (the page bolds whole titles)
    assert links == [] and images == [] and bold == [], (links, images, bold)


def test_a_hostile_link_renders_as_text_and_the_browser_contacts_no_other_host(browser_page):
    """?model=zoo:<Markdown> used to render links, bold text and a remote image in the app's own error box."""
    server, proxy, page, requests = browser_page
    page.goto(f"{proxy.base}/?model=zoo:{quote(HOSTILE_TEXT)}")
    screenshot.wait_rendered(page)
    body = page.inner_text("body").replace("\u2060", "")  # the word joiners that keep URLs text
    assert "[link](http://evil.example/l)" in body and "**bold**" in body, body[:1500]
    no_live_markup(page)
    assert page.locator("[data-testid='stException']").count() == 0
    assert foreign(requests, proxy.base) == []
    assert not server.contacted()
    assert proxy.seen and all(chain.endswith("203.0.113.50") for chain in proxy.seen)


def test_a_hostile_saved_analysis_renders_as_text_in_the_gallery(browser_page):
    """Titles and notes are the saver's: their Markdown, HTML and bare URLs show as typed, never as links."""
    server, proxy, page, requests = browser_page
    saved = open_store(str(server.store)).save(SavedAnalysis(
        title=f"Title {HOSTILE_TEXT}", note=f"Note {HOSTILE_TEXT}", panel="kv", model="zoo:shapes-lm",
        saved_by=f"saver https://{EVIL}"))
    for path in ("saved-analyses", f"saved-analyses?id={saved}", f"saved-analyses?id={saved}&embed=true"):
        page.goto(f"{proxy.base}/{path}")
        screenshot.wait_rendered(page)
        body = page.inner_text("body").replace("\u2060", "")  # the word joiners that keep URLs text
        assert f"https://{EVIL}/bare" in body and "<img src=" in body, (path, body[:1500])
        no_live_markup(page)
        assert page.locator("[data-testid='stException']").count() == 0, path
    assert foreign(requests, proxy.base) == []
    assert not server.contacted()


MARKUP = "<img src=x onerror=window.__pwned=1> **bold**"


def _data_zip() -> bytes:
    """A visitor's data zip whose captions carry HTML and Markdown."""
    import io
    import json
    import zipfile

    from PIL import Image

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        lines = []
        for i in range(6):
            image = io.BytesIO()
            Image.new("RGB", (32, 32), (40 * i, 200 - 30 * i, 90)).save(image, format="PNG")
            name = f"img{i}.png"
            archive.writestr(name, image.getvalue())
            lines.append({"image": name, "caption": f"a red square {MARKUP} {i}"})
        archive.writestr("captions.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    return buffer.getvalue()


@pytest.mark.skipif("shapes-vlm" not in zoo_models(), reason="needs the demo VLM")
def test_uploaded_captions_show_as_text_in_chromium(browser_page, monkeypatch):
    """An attacker's uploaded data (its captions) opened by another visitor through its link
    (`&data=upload:<id>&view=ranking`, #50): the markup shows as typed and no element is made from it."""
    from analysis.sae_v import types, userdata

    server, proxy, page, requests = browser_page
    monkeypatch.setattr(types, "CACHE_ROOT", server.cache / "sae")  # the server's upload area, as its upload would
    locator = userdata.save_zip(_data_zip(), owner="ip:203.0.113.66")
    page.goto(f"{proxy.base}/sae-features?model=zoo:shapes-vlm&data={quote(locator)}&view=ranking&thr=0")
    screenshot.wait_rendered(page, timeout_ms=300_000)
    body = page.inner_text("body").replace("\u2060", "")
    assert "a red square <img src=x onerror=" in body and "**bold**" in body, body[:3000]
    made = page.evaluate("() => [document.querySelectorAll('img[onerror], img[src=\"x\"]').length, "
                         "[...document.querySelectorAll('strong, b, em')].filter(s => s.innerText.trim() === 'bold')"
                         ".length, window.__pwned === undefined]")
    assert made == [0, 0, True], made
    assert page.locator("[data-testid='stException']").count() == 0
    assert foreign(requests, proxy.base) == []
