"""A public instance under attack (AppTest, in-process): the `deploy/public.toml` example configuration
against disallowed models in links (Hub ids, local paths, traversal, symlinks), hostile uploads
(not images, decompression bombs, 50 MB), a 1 MB prompt, script text in every text field and saved
title, the per-visitor rate limit and the concurrency limit, sign-in (access token, OIDC), embeds,
hidden panels, a read-only gallery, and a broken configuration file.

The server-level half (20 protocol clients for 60 s, two servers on one PostgreSQL database, a
server killed mid-save, a 50 MB upload against the real upload endpoint, embeds in Chromium) is
tests/browser/test_public_instance.py.
"""
from __future__ import annotations

import io
import re
import struct
import threading
import time
import zlib
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from analysis.framework import config as cfg
from analysis.model_access.models import ModelLoadError, ModelSpec, load_model, zoo_models
from analysis.hosting.store import AnalysisStore, SavedAnalysis
from conftest import ROOT

PUBLIC = ROOT / "deploy" / "public.toml"
SCRIPT = "<script>alert(1)</script>"
HAS_ZOO = "shapes-lm" in zoo_models()
pytestmark = pytest.mark.skipif(not HAS_ZOO, reason="needs the demo zoo (python -m analysis.zoo build)")


def write_config(tmp_path: Path, extra: str = "", base: Path = PUBLIC) -> Path:
    """The public example with some settings changed: `extra` lines 'section.key = TOML value'."""
    import json
    import tomllib

    raw = tomllib.loads(base.read_text())
    for line in extra.strip().splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.strip().partition(".")
        raw.setdefault(section, {})[name] = tomllib.loads(f"v = {value.strip()}")["v"]
    out = [f"{k} = {json.dumps(v)}" for k, v in raw.items() if not isinstance(v, dict)]
    for section, values in raw.items():
        if isinstance(values, dict):
            out.append(f"[{section}]")
            out += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    path = tmp_path / "instance.toml"
    path.write_text("\n".join(out) + "\n")
    return path


@pytest.fixture()
def public(monkeypatch, tmp_path):
    """The public example in force, a store of its own, and a fresh rate limiter."""
    from components import hosting, limits

    monkeypatch.setenv("MODEL_INSPECTOR_CONFIG", str(PUBLIC))
    monkeypatch.setenv("MODEL_INSPECTOR_STORE", str(tmp_path / "analyses.db"))
    hosting._LIMITER.clear()
    limits.clear()
    yield tmp_path
    hosting._LIMITER.clear()
    limits.clear()


def use(monkeypatch, path: Path) -> None:
    monkeypatch.setenv("MODEL_INSPECTOR_CONFIG", str(path))


def app(page: str | None = None, query: dict | None = None, context: dict | None = None,
        user: dict | None = None, state: dict | None = None, timeout: float = 120) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=timeout)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    if context is not None:
        at.context = context
    if user is not None:
        at.user = user
    for key, value in (state or {}).items():
        at.session_state[key] = value
    at.run()
    if page is not None and not at.exception:
        at.switch_page(page)
        at.run()
    return at


def texts(at) -> str:
    parts = [e.value for kind in ("markdown", "caption", "warning", "error", "info", "success", "title", "subheader")
             for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts)


def no_raw_script(at) -> None:
    for kind in ("markdown", "caption", "warning", "error", "info", "success", "subheader", "title"):
        for element in getattr(at, kind):
            assert "<script>" not in str(element.value), (kind, element.value)
    from components.narrow_sidebar import FOLD_JS

    for element in at.get("html"):
        if element.proto.body == FOLD_JS:
            continue  # the app's own script (the sidebar folds in a narrow window), the same on every page
        assert "<script>" not in element.proto.body


# ---------------------------------------------------------------------------------------------
# Models named by a link


DISALLOWED = ["hub:gpt2", "hub:openai-community/gpt2@main", "local:/etc", "local:../../../../etc",
              f"local:{ROOT / 'analysis' / 'zoo' / 'models' / 'shapes-lm'}", "hub:" + SCRIPT]


@pytest.fixture()
def loader_must_not_run(monkeypatch):
    """Any load other than the default's raises; so does any Hub download. Returns the loads asked for."""
    import huggingface_hub

    from components import model_picker

    real = model_picker.load_model
    asked = []

    def guarded(spec):
        asked.append(spec.label)
        if spec.label != "zoo:shapes-lm":
            raise AssertionError(f"the loader was called for {spec.label}")
        return real(spec)

    def no_network(*args, **kwargs):
        raise AssertionError("a Hub download was attempted")

    monkeypatch.setattr(model_picker, "load_model", guarded)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    model_picker._load_cached.clear()
    yield asked
    model_picker._load_cached.clear()


@pytest.mark.parametrize("label", DISALLOWED)
def test_disallowed_model_in_a_link_is_refused_before_the_loader(public, loader_must_not_run, label):
    at = app(query={"model": label})
    assert not at.exception, [e.value for e in at.exception]
    refused = " ".join(w.value for w in at.warning)
    assert "was not loaded" in refused and "does not load models from" in refused, refused
    assert at.session_state["model_spec"] == ModelSpec("zoo", "shapes-lm")  # the default instead
    assert at.query_params["model"] == "zoo:shapes-lm"  # the link now says what is shown
    assert loader_must_not_run in ([], ["zoo:shapes-lm"])  # never asked for the refused one
    no_raw_script(at)


def test_zoo_traversal_in_a_link_never_leaves_the_zoo(public):
    at = app(query={"model": "zoo:../../../../etc"})
    assert not at.exception
    assert "is not a zoo model" in " ".join(e.value for e in at.error)
    assert at.session_state["model_spec"] == ModelSpec("zoo", "shapes-lm")


def test_picker_offers_only_allowed_sources(public):
    at = app()
    assert at.sidebar.radio(key="picker_source").options == ["Zoo"]
    assert not at.sidebar.text_input  # no free Hub id or folder box


def test_hub_allow_list_is_a_pick_list_and_other_ids_are_refused(monkeypatch, tmp_path, loader_must_not_run):
    path = write_config(tmp_path, 'models.sources = ["zoo", "hub"]\nmodels.hub_models = ["HuggingFaceTB/SmolLM2-135M"]')
    use(monkeypatch, path)
    config = cfg.current()
    assert config.model_refusal("hub", "HuggingFaceTB/SmolLM2-135M") is None
    assert "not among the Hub models" in config.model_refusal("hub", "gpt2")
    at = app(query={"model": "hub:gpt2"})
    assert not at.exception and "not among the Hub models" in " ".join(w.value for w in at.warning)
    at.sidebar.radio(key="picker_source").set_value("hub").run()
    assert at.sidebar.selectbox(key="picker_hub_list").options == ["HuggingFaceTB/SmolLM2-135M"]


def test_loader_itself_refuses_what_the_configuration_refuses(public, monkeypatch):
    """Second line: analysis/model_access/models.py checks the same allow-list before reading or fetching anything
    (the command line and any other caller go through it)."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: pytest.fail("download attempted"))
    for label in ("hub:gpt2", "local:/tmp"):
        with pytest.raises(ModelLoadError, match="does not load models from"):
            load_model(ModelSpec.parse(label))


def test_local_allow_list_resolves_traversal_and_symlinks(monkeypatch, tmp_path, tiny_llama_dir):
    """With local folders allowed, only the configured ones: '..' and a symlink out of them are refused
    after resolving, before any file of the target is read as a model."""
    import shutil

    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    shutil.copytree(tiny_llama_dir, outside / "model")
    (allowed / "link").symlink_to(outside / "model", target_is_directory=True)
    shutil.copytree(tiny_llama_dir, allowed / "inside")
    path = write_config(tmp_path, f'models.sources = ["zoo", "local"]\nmodels.local_folders = ["{allowed}"]')
    use(monkeypatch, path)
    monkeypatch.delenv("MODEL_INSPECTOR_ROOTS", raising=False)
    for name in (str(allowed / "link"), str(allowed / ".." / "outside" / "model"), "/etc"):
        with pytest.raises(ModelLoadError, match="outside the folders models may be loaded from"):
            load_model(ModelSpec("local", name))
    assert load_model(ModelSpec("local", str(allowed / "inside"))).kind == "causal_lm"


# ---------------------------------------------------------------------------------------------
# Uploads


def png(width: int, height: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    """A valid 1x1 PNG whose header claims width x height (what a decompression bomb looks like before decoding)."""
    data = bytearray(png(1, 1))
    ihdr = 8 + 8  # signature, then the IHDR chunk's length and type
    data[ihdr:ihdr + 8] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[12:ihdr + 13])) & 0xFFFFFFFF
    data[ihdr + 13:ihdr + 17] = struct.pack(">I", crc)
    return bytes(data)


def test_uploads_refused_before_decoding(public):
    config = cfg.current()
    assert config.upload_problem(png(64, 48), "ok.png") is None
    cases = {
        "notes.png": (b"%PDF-1.7\n" + b"x" * 1000, "not an image"),
        "script.png": (SCRIPT.encode(), "not an image"),
        "empty.png": (b"", "not an image"),
        "bomb.png": (png_claiming(100_000, 100_000), "decompression bomb"),
        "wide.png": (png_claiming(4096, 2048), "above the limit of 4,194,304 pixels"),
        "huge.png": (b"\x89PNG\r\n\x1a\n" + b"\0" * (50 * 2**20), "images up to 5 MB are accepted"),
    }
    for name, (data, expected) in cases.items():
        problem = config.upload_problem(data, name)
        assert problem is not None and expected in problem, (name, problem)
    assert "turned off" in cfg.upload_problem(png(8, 8), "x.png", cfg.Uploads(enabled=False))


def test_views_take_uploads_only_through_the_checked_uploader():
    """A page calling st.file_uploader itself would skip the instance's limits."""
    for page in (ROOT / "views").glob("*.py"):
        assert "st.file_uploader(" not in page.read_text(), page.name


@pytest.mark.skipif("shapes-vlm" not in zoo_models(), reason="needs the demo VLM")
@pytest.mark.parametrize("name,data,expected", [
    ("big.png", b"\x89PNG\r\n\x1a\n" + b"\0" * (6 * 2**20), "images up to 5 MB are accepted"),
    ("wide.png", png_claiming(3000, 3000), "above the limit of 4,194,304 pixels"),
    ("bomb.png", png_claiming(100_000, 100_000), "decompression bomb"),
    ("notes.png", SCRIPT.encode(), "not an image"),
])
def test_upload_refused_on_the_page_with_one_line(public, monkeypatch, name, data, expected):
    from analysis import captions

    monkeypatch.setattr(captions, "Upload", lambda *a, **k: pytest.fail("the page took a refused upload"))
    at = app("views/caption_correction.py", query={"model": "zoo:shapes-vlm", "src": "upload"})
    at.file_uploader(key="cap_upload").set_value((name, data, "image/png"))
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert expected in " ".join(e.value.replace("\\", "") for e in at.error)
    no_raw_script(at)


@pytest.mark.skipif("shapes-vlm" not in zoo_models(), reason="needs the demo VLM")
def test_uploads_off_says_so_on_the_caption_page(monkeypatch, tmp_path, public):
    use(monkeypatch, write_config(tmp_path, "uploads.enabled = false"))
    at = app("views/caption_correction.py", query={"model": "zoo:shapes-vlm", "src": "upload"})
    assert not at.exception
    assert "Uploads are turned off" in " ".join(i.value for i in at.info)
    assert not at.get("file_uploader")


# ---------------------------------------------------------------------------------------------
# Text: a 1 MB prompt, script text everywhere


@pytest.mark.parametrize("page,key", [("views/attention_sharpness.py", "sh_text"),
                                      ("views/kv_cache.py", "kv_prompt"),
                                      ("views/prompt_reconstruction.py", None)])
def test_a_one_megabyte_prompt_is_refused_with_one_line(public, computations, page, key):
    at = app(page, timeout=300)
    assert not at.exception, [e.value for e in at.exception]
    if key == "sh_text":  # the own prompt is a later section of the page, opened through its selector
        at.segmented_control(key="sh_chapter").set_value("Your own prompt").run()
    box = ([w for w in list(at.text_area) + list(at.text_input) if w.key == key] if key else
           [w for w in at.text_input if "Prompt" in w.label])[0]
    computations.clear()
    box.set_value("na " * 350_000)  # ~1 MB
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    refusal = " ".join(e.value for e in at.error)
    # the instance's limit (after the page's own box may have cut the text: KV keeps 20,000 characters),
    # or the page's own (prompt reconstruction counts tokens first: 64 at most)
    assert re.search(r"The text is [\d,]+ characters long; this instance accepts up to 2,000", refusal) \
        or "the limit here is" in refusal, refusal
    assert computations == []


@pytest.mark.parametrize("page", ["views/attention_sharpness.py", "views/kv_cache.py",
                                  "views/prompt_reconstruction.py"])
def test_script_text_in_every_text_field_stays_text(public, page):
    at = app(page, timeout=300)
    for box in list(at.text_input) + list(at.text_area):
        box.set_value(SCRIPT)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    no_raw_script(at)


SHARE_PAGE = """
import plotly.graph_objects as go
import streamlit as st
from components.share import share_bar
fig = go.Figure(go.Bar(x=["a", "b"], y=[3, 4]))
share_bar("demo", title="Demo", params={"n": 3}, result={"values": [3, 4]}, model="zoo:shapes-lm",
          figures={"Demo figure": fig}, tables={"rows": [{"x": "a", "y": 3}]})
"""


def open_share(user: dict | None = None, state: dict | None = None) -> AppTest:
    at = AppTest.from_string(SHARE_PAGE, default_timeout=60)
    at.session_state["share_demo_open"] = True
    if user is not None:
        at.user = user
    for key, value in (state or {}).items():
        at.session_state[key] = value
    at.run()
    return at


def test_script_in_saved_title_and_note_is_escaped_everywhere(monkeypatch, public):
    use(monkeypatch, write_config(public, "gallery.writable = true"))
    at = open_share()
    at.text_input(key="share_demo_title").set_value(f'{SCRIPT}" onload="x')
    at.text_area(key="share_demo_note").set_value(SCRIPT + " [x](javascript:alert(1))")
    at.button[0].click().run()
    assert not at.exception
    no_raw_script(at)
    saved = AnalysisStore(public / "analyses.db").list()[0]
    assert saved.title.startswith(SCRIPT)  # stored as typed, escaped where shown
    gallery = app("views/saved_analyses.py")
    opened = app("views/saved_analyses.py", query={"id": saved.id})
    embedded = app("views/saved_analyses.py", query={"id": saved.id}, context={"is_embedded": True})
    for view in (gallery, opened, embedded):
        assert not view.exception, [e.value for e in view.exception]
        no_raw_script(view)
    snippet = [c.value for c in opened.code if c.value.startswith("<iframe")][0]
    assert "<script>" not in snippet and '" onload' not in snippet and "&lt;script&gt;" in snippet
    assert "&quot; onload" in snippet and "embed=true" in snippet


# ---------------------------------------------------------------------------------------------
# Limits on heavy work


RATE_PAGE = """
import streamlit as st
from analysis.framework.registry import SettingsError
from components.runs import cached_run
import dataclasses

@dataclasses.dataclass
class P:
    n: int
    def to_json(self):
        return str(self.n)

class H:
    class spec:
        label = "zoo:rate-test"
    path = ""

calls = st.session_state.setdefault("calls", [])
def work(handle, params, progress):
    calls.append(params.n)
    return params.n * 2

n = st.session_state.setdefault("n", 0)
st.session_state.n += 1
st.write(f"result {cached_run('rate', work, H(), P(n), label='Working')}")
"""


def test_visitor_over_the_rate_limit_is_told_when_to_come_back(monkeypatch, public):
    from components import runs

    # (its analysis is no panel's: no estimate, which the public example's largest-run and memory limits refuse)
    use(monkeypatch, write_config(public, "limits.runs_per_minute = 2\nlimits.max_run_seconds = 0\nlimits.max_run_mb = 0\nlimits.server_mb = 0"))
    runs.run_store().clear()  # nothing computed by another test counts as ready
    estimated = []
    real_estimate = runs.cost.estimate
    monkeypatch.setattr(runs.cost, "estimate", lambda *a, **k: estimated.append(1) or real_estimate(*a, **k))
    at = AppTest.from_string(RATE_PAGE, default_timeout=30)
    at.run()
    at.run()
    assert at.session_state["calls"] == [0, 1] and not at.warning and len(estimated) == 2
    at.run()  # a third new computation within the minute
    assert not at.exception
    assert at.session_state["calls"] == [0, 1]  # not started
    assert len(estimated) == 2  # refused before the estimate too (it may run the model)
    message = at.warning[0].value
    assert "You have started 2 views with new analyses in the last minute" in message
    assert "You can run again in" in message
    at.run()  # still over: nothing starts, the page says so again
    assert at.session_state["calls"] == [0, 1] and "You can run again in" in at.warning[0].value


def test_rate_limit_holds_where_two_tabs_pass_the_guard_together(monkeypatch, public):
    """The guard before the estimate only reads the count; the start itself is counted (and refused)
    where the computation begins, so two tabs of one visitor cannot both slip past the guard."""
    from components import limits, runs

    # (its analysis is no panel's: no estimate, which the public example's largest-run and memory limits refuse)
    use(monkeypatch, write_config(public, "limits.runs_per_minute = 2\nlimits.max_run_seconds = 0\nlimits.max_run_mb = 0\nlimits.server_mb = 0"))
    monkeypatch.setattr(runs, "_GUARDS", [g for g in runs._GUARDS if g is not limits.check_run])
    runs.run_store().clear()  # nothing computed by another test counts as ready
    at = AppTest.from_string(RATE_PAGE, default_timeout=30)
    for _ in range(3):
        at.run()
    assert not at.exception and at.session_state["calls"] == [0, 1]
    assert "You can run again in" in at.warning[0].value


def test_rate_limiter_window():
    from components.hosting import RateLimiter

    limiter = RateLimiter()
    assert [limiter.wait_s("v", 3, record=True, now=t) for t in (0, 1, 2)] == [0, 0, 0]
    assert limiter.wait_s("v", 3, record=True, now=30) == pytest.approx(30)
    assert limiter.wait_s("w", 3, record=True, now=30) == 0  # per visitor
    assert limiter.wait_s("v", 3, record=True, now=60.5) == 0  # the first start left the window
    assert limiter.wait_s("v", 0, record=True, now=61) == 0  # 0: no limit


def test_concurrency_limit_holds_under_threads():
    from components.limits import Slots

    slots, peak, lock = Slots(), [0], threading.Lock()
    running = [0]

    def worker() -> None:
        while not slots.acquire(2, timeout=0.05):
            pass
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        slots.release()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 2 and slots.peak == 2 and slots.running == 0


# ---------------------------------------------------------------------------------------------
# Sign-in, read-only gallery, embeds, hidden panels, a broken file


def test_access_token_sign_in(monkeypatch, public):
    monkeypatch.setenv(cfg.TOKEN_ENV, "s3cret-token")
    use(monkeypatch, write_config(public, 'auth.mode = "token"\nauth.signed_out = "none"\ngallery.writable = true'))
    at = app()
    assert not at.exception
    assert "for signed-in visitors" in " ".join(i.value for i in at.info)
    assert not at.sidebar.radio  # nothing else of the app
    at.text_input(key="mi_sign_in_name").set_value("Ada")
    at.text_input(key="mi_sign_in_token").set_value("wrong")
    at.button[0].click().run()
    assert "not right" in " ".join(e.value for e in at.error) and "model_spec" not in at.session_state
    for _ in range(5):  # brute force: the sixth attempt within a minute is refused outright
        at.text_input(key="mi_sign_in_token").set_value("s3cret-token")
        at.button[0].click().run()
        if "_mi_user" in at.session_state:
            break
    assert at.session_state["_mi_user"]["name"] == "Ada"
    assert at.sidebar.radio(key="picker_source")  # the app itself now
    saved = open_share(state={"_mi_user": {"name": "Ada", "via": "token"}})
    saved.button[0].click().run()
    assert AnalysisStore(public / "analyses.db").list()[0].saved_by == "Ada"


def test_sign_in_attempts_are_rate_limited(monkeypatch, public):
    monkeypatch.setenv(cfg.TOKEN_ENV, "s3cret-token")
    use(monkeypatch, write_config(public, 'auth.mode = "token"\nauth.signed_out = "none"'))
    at = app()
    for _ in range(6):
        at.text_input(key="mi_sign_in_name").set_value("Eve")
        at.text_input(key="mi_sign_in_token").set_value("guess")
        at.button[0].click().run()
    at.text_input(key="mi_sign_in_token").set_value("s3cret-token")  # even the right token, now
    at.button[0].click().run()
    assert "Too many sign-in attempts" in " ".join(e.value for e in at.error)
    assert "_mi_user" not in at.session_state


def test_token_mode_needs_the_secret_in_the_environment(monkeypatch, public):
    monkeypatch.delenv(cfg.TOKEN_ENV, raising=False)
    with pytest.raises(cfg.ConfigError, match="MODEL_INSPECTOR_ACCESS_TOKEN is not set"):
        cfg.parse('[auth]\nmode = "token"\n')


def test_oidc_sign_in_records_the_email_and_signed_out_visitors_read_only(monkeypatch, public):
    use(monkeypatch, write_config(public, 'auth.mode = "oidc"\ngallery.writable = true'))
    signed_out = open_share(user={"is_logged_in": False})
    assert not signed_out.exception
    assert not signed_out.get("form") and "Sign in" in " ".join(c.value for c in signed_out.caption)
    signed_in = open_share(user={"is_logged_in": True, "email": "ada@example.org", "name": "Ada"})
    signed_in.button[0].click().run()
    assert AnalysisStore(public / "analyses.db").list()[0].saved_by == "ada@example.org"
    at = app(user={"is_logged_in": False})  # signed_out = read-only: the app opens
    assert not at.exception and at.sidebar.radio(key="picker_source")
    # the sign-in says it is not set up; on a public instance without the operator's instructions
    shown = " ".join(e.value for e in at.sidebar.error).replace("\\", "")
    assert "Sign-in is not set up on this server" in shown and "secrets.toml" not in shown


def test_read_only_gallery_offers_no_save_and_no_delete(public):
    store = AnalysisStore(public / "analyses.db")
    saved_id = store.save(SavedAnalysis(title="kept", panel="kv", model="zoo:shapes-lm"))
    at = open_share()
    assert not at.get("form") and "read-only" in " ".join(c.value for c in at.caption)
    opened = app("views/saved_analyses.py", query={"id": saved_id})
    assert not opened.exception and opened.subheader[0].value == "kept"
    assert not [b for b in opened.button if b.key == "confirm_delete"] and not opened.get("popover")
    assert store.get(saved_id) is not None


PANEL_PAGES = ["views/overview.py", "views/attention_sharpness.py", "views/kv_cache.py",
               "views/prompt_reconstruction.py"]


@pytest.mark.parametrize("page", PANEL_PAGES)
def test_embed_shows_the_view_without_sidebar_or_share_bar(public, page):
    at = app(page, context={"is_embedded": True}, timeout=300)
    assert not at.exception, [e.value for e in at.exception]
    assert not at.sidebar.radio and not at.sidebar.selectbox  # no model picker
    assert not [e for e in at.expander if "Share" in e.label]
    assert any("stSidebar" in h.proto.body and "display: none" in h.proto.body for h in at.get("html"))
    assert at.title  # the view itself is there


def test_saved_analysis_embed_shows_figures_only(public):
    store = AnalysisStore(public / "analyses.db")
    saved_id = store.save(SavedAnalysis(
        title="KV run", panel="kv", model="zoo:shapes-lm", note="a note",
        figures=[{"name": "fig", "figure": {"data": [{"type": "bar", "y": [1, 2]}], "layout": {}}}],
        tables={"policies": [{"policy": "h2o", "acc": 0.5}]}))
    at = app("views/saved_analyses.py", query={"id": saved_id}, context={"is_embedded": True})
    assert not at.exception
    assert at.subheader[0].value == "KV run" and len(at.get("plotly_chart")) == 1 and len(at.dataframe) == 1
    assert not at.button and not at.code and not at.get("download_button") and not at.expander
    assert not at.title  # no page chrome


def test_share_bar_offers_the_iframe_snippet(monkeypatch, public):
    from components import hosting

    snippet = hosting.embed_snippet("https://x.example/kv-cache?budget=16&prompt=a%20b", 'A "title" <b>')
    assert snippet.startswith('<iframe src="https://x.example/kv-cache?budget=16&amp;prompt=a%20b&amp;embed=true"')
    assert 'title="A &quot;title&quot; &lt;b&gt;"' in snippet
    assert hosting.embed_snippet("https://x.example/saved-analyses?id=a&embed=true", "t").count("embed=true") == 1


def test_hidden_panel_is_left_out_and_pages_still_work(monkeypatch, public):
    use(monkeypatch, write_config(public, 'panels.hidden = ["prompt-reconstruction", "saved-analyses"]'))
    at = app()
    assert not at.exception
    links = [p.proto.page for p in at.get("page_link")]
    assert "kv-cache" in links and not {"prompt-reconstruction", "saved-analyses"} & set(links)
    assert "Coming next" not in texts(at)
    shared = open_share()  # its "open saved analysis" link has nowhere to go: no error either
    assert not shared.exception


def test_broken_configuration_is_one_line_not_a_traceback(monkeypatch, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[limits]\nrun_per_minute = 3\n')  # a typo: refused, not silently ignored
    monkeypatch.setenv("MODEL_INSPECTOR_CONFIG", str(bad))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.run()
    assert not at.exception
    shown = at.error[0].value.replace("\\", "")
    assert "unknown setting" in shown and "limits.run_per_minute" in shown
    assert str(tmp_path) not in shown  # a broken file: the page says as little as it can about the server
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "analysis.framework.config", str(bad)], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 1 and out.stderr.startswith("error: unknown setting")
    monkeypatch.setenv("MODEL_INSPECTOR_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(cfg.ConfigError, match="does not exist"):
        cfg.current()


def test_no_file_means_the_local_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv("MODEL_INSPECTOR_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    config = cfg.current()
    assert config.models.sources == ("zoo", "hub", "local") and config.hub_allow_list() is None
    assert config.gallery.writable and config.auth.mode == "none" and config.limits == cfg.Limits()
    assert config.model_refusal("hub", "gpt2") is None and config.uploads.enabled
    public = cfg.parse(PUBLIC.read_text(), str(PUBLIC))
    assert public.models.sources == ("zoo",) and not public.gallery.writable
    assert public.limits.max_prompt_chars == 2000 and public.limits.runs_per_minute > 0


def test_a_public_instance_shows_no_error_details_however_it_was_started(public):
    """`public = true` turns Streamlit's client.showErrorDetails off from the page too (scripts/serve.py
    passes it on the command line; `streamlit run app.py` would not)."""
    import streamlit as st

    before = st.get_option("client.showErrorDetails")
    try:
        at = app()
        assert not at.exception
        assert st.get_option("client.showErrorDetails") == "none"
    finally:
        st.set_option("client.showErrorDetails", before)
