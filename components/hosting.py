"""What a hosted instance adds to the pages: the configuration in force, sign-in, embeds, upload checks,
and the limits on heavy work (how many run at once, how many one visitor may start per minute).

All of it is driven by the deployment configuration (`analysis/config.py`, docs/deploy.md); with no
configuration file every function here leaves the app exactly as a local run always was.

- `settings()`: the configuration, or a clear message and a stopped page when the file is bad.
- `sign_in_gate()`: app.py calls it first; with `auth.mode` "token" or "oidc" it shows the sign-in
  form and stops the page for a signed-out visitor unless `auth.signed_out = "read-only"`.
- `is_embedded()` / `embed_page()`: `?embed=true` shows the view only (no sidebar, controls or share bar).
- `file_uploader(...)`: `st.file_uploader` that refuses what the configuration refuses (off, size,
  not an image, pixels, decompression bombs) with one line, before the page decodes anything.
- `check_run(key, handle, params)` (a guard of components/runs.py, before the estimate) and
  `run_slot(label)` (around the computation itself): the longest prompt, the per-visitor rate and the
  concurrency limit.
"""
from __future__ import annotations

import collections
import contextlib
import hmac
import html
import re
import threading
import time
from typing import Any, Iterator

import streamlit as st

from analysis import config as cfg

USER_KEY = "_mi_user"  # {"name": ..., "via": "token" | "oidc"} once signed in with the access token


def settings() -> cfg.Config:
    """The deployment configuration; a bad file stops the page with one line (never a traceback)."""
    try:
        return cfg.current()
    except cfg.ConfigError as exc:
        st.error(f"This server's configuration is invalid: {exc}", icon=":material/error:")
        st.stop()
        raise  # st.stop raises; this keeps type checkers quiet


def escape_markdown(text: str) -> str:
    """User text shown through Markdown as plain text: no links, emphasis, HTML or directives."""
    text = html.escape(str(text).replace("\n", " "), quote=False)
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|~:$<>])", r"\\\1", text)


# ---------------------------------------------------------------------------------------------
# Sign-in


def _oidc_user() -> dict:
    try:
        info = st.user.to_dict()
    except Exception:  # no session (a bare script), or Streamlit without st.user
        return {}
    return info if info.get("is_logged_in") else {}


def _oidc_configured() -> bool:
    try:
        return "auth" in st.secrets
    except Exception:  # no secrets file at all
        return False


def signed_in_user() -> str:
    """Who this visitor is signed in as ('' when signed out, or when the instance has no sign-in)."""
    mode = settings().auth.mode
    if mode == "oidc":
        user = _oidc_user()
        return str(user.get("email") or user.get("name") or user.get("sub") or "")[:200]
    if mode == "token":
        user = st.session_state.get(USER_KEY)
        return str(user["name"]) if user else ""
    return ""


def may_save() -> tuple[bool, str]:
    """(whether this visitor may save or delete analyses, why not)."""
    config = settings()
    if not config.gallery.writable:
        return False, "This instance's gallery is read-only: saved analyses open for everyone, nothing new is saved."
    if config.auth.mode != "none" and not signed_in_user():
        return False, "Sign in (in the sidebar) to save analyses."
    return True, ""


def sign_in_gate() -> None:
    """Before any page: a visitor who must sign in sees the sign-in form and nothing else."""
    config = settings()
    if config.auth.mode == "none" or signed_in_user():
        return
    if config.auth.signed_out == "read-only":
        return  # every page opens; saving and deleting ask for sign-in (may_save)
    st.title("Model Inspector")
    st.info("This instance is for signed-in visitors.", icon=":material/lock:")
    sign_in_form(main=True)
    st.stop()


def sign_in_form(main: bool = False) -> None:
    """The sign-in control for the configured mode: st.login's button, or the access-token form."""
    config = settings()
    if config.auth.mode == "oidc":
        if not _oidc_configured():
            st.error("Sign-in is set to OIDC but the server has no [auth] section in .streamlit/secrets.toml; "
                     "see docs/deploy.md.", icon=":material/error:")
            return
        if st.button("Sign in", key="mi_login", type="primary", icon=":material/login:"):
            st.login(config.auth.provider or None)
        return
    if config.auth.mode != "token":
        return
    with st.form("mi_sign_in", border=main):
        name = st.text_input("Your name (shown on what you save)", max_chars=80, key="mi_sign_in_name")
        token = st.text_input("Access token", type="password", max_chars=500, key="mi_sign_in_token")
        if st.form_submit_button("Sign in", type="primary"):
            _try_token(name, token)
    problem = st.session_state.pop("_mi_sign_in_problem", None)
    if problem:
        st.error(problem, icon=":material/error:")


SIGN_IN_ATTEMPTS_PER_MINUTE = 5


def _try_token(name: str, token: str) -> None:
    wait = _LIMITER.wait_s("sign-in:" + visitor_id(), SIGN_IN_ATTEMPTS_PER_MINUTE, record=True)
    if wait:
        st.session_state["_mi_sign_in_problem"] = (f"Too many sign-in attempts; try again in {wait:.0f} s.")
        return
    expected = cfg.access_token()
    if not expected or not hmac.compare_digest(token.encode(), expected.encode()):
        st.session_state["_mi_sign_in_problem"] = "That access token is not right."
        return
    if not name.strip():
        st.session_state["_mi_sign_in_problem"] = "Enter your name: it is shown on the analyses you save."
        return
    st.session_state[USER_KEY] = {"name": " ".join(name.split())[:80], "via": "token"}
    st.rerun()


def account_box() -> None:
    """The sidebar's sign-in / signed-in line (nothing when the instance has no sign-in)."""
    config = settings()
    if config.auth.mode == "none":
        return
    user = signed_in_user()
    if user:
        c1, c2 = st.columns([3, 2], vertical_alignment="center")
        c1.caption(f"Signed in as **{escape_markdown(user)}**")
        if c2.button("Sign out", key="mi_logout"):
            if config.auth.mode == "oidc":
                st.logout()
            st.session_state.pop(USER_KEY, None)
            st.rerun()
    else:
        with st.expander("Sign in", icon=":material/login:"):
            sign_in_form()


# ---------------------------------------------------------------------------------------------
# Embeds


def is_embedded() -> bool:
    """`?embed=true` (Spaces and Streamlit Cloud add it; the share bar's iframe snippet has it)."""
    if not settings().embeds.enabled:
        return False
    try:
        return bool(st.context.is_embedded)
    except Exception:  # no browser context (a bare script)
        return False


# Widgets are hidden in an embed: the view is what its URL says, read-only. Buttons, inputs, pickers,
# toggles; plotly's own legend and zoom stay (they change nothing on the server).
_EMBED_CSS = """
<style>
[data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"], [data-testid="stExpandSidebarButton"],
[data-testid="stHeader"], [data-testid="stToolbar"],
.stButton, .stDownloadButton, .stFormSubmitButton, [data-testid="stForm"], .stPageLink,
.stTextInput, .stTextArea, .stNumberInput, .stSelectbox, .stMultiSelect, .stSlider, .stSelectSlider,
.stRadio, .stCheckbox, .stToggle, .stFileUploader, .stColorPicker, .stDateInput, .stTimeInput,
.stPills, .stSegmentedControl, .stButtonGroup, .stChatInput, .stPopover {
  display: none !important;
}
.block-container, [data-testid="stMainBlockContainer"] { padding-top: 0.5rem !important; max-width: 100% !important; }
</style>
"""


def embed_page() -> None:
    """Hide everything but the view (sidebar, controls, share bar, header) for an iframe."""
    st.html(_EMBED_CSS)


def embed_snippet(url: str, title: str, height: int = 640) -> str:
    """The <iframe> a blog post or slide deck pastes; the URL and title escaped for an attribute."""
    sep = "&" if "?" in url else "?"
    src = url if re.search(r"[?&]embed=true(&|$)", url) else f"{url}{sep}embed=true"
    return (f'<iframe src="{html.escape(src, quote=True)}" title="{html.escape(title, quote=True)}" '
            f'width="100%" height="{int(height)}" style="border:0" loading="lazy"></iframe>')


# ---------------------------------------------------------------------------------------------
# Uploads


def file_uploader(label: str, key: str, **kwargs) -> Any:
    """`st.file_uploader` under the configuration: None (with one line saying why) when uploads are
    off or this file is refused; the pages' own checks still run after this one."""
    config = settings()
    if not config.uploads.enabled:
        st.info("Uploads are turned off on this instance.", icon=":material/block:")
        return None
    upload = st.file_uploader(label, key=key, **kwargs)
    if upload is None:
        return None
    problem = config.upload_problem(upload.getvalue(), upload.name)
    if problem:
        st.error(escape_markdown(problem), icon=":material/error:")
        return None
    return upload


# ---------------------------------------------------------------------------------------------
# Limits on heavy work


class RateLimiter:
    """Start times per visitor over the last minute (one server; each replica counts its own)."""

    WINDOW_S = 60.0
    MAX_VISITORS = 10_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: dict[str, collections.deque] = {}

    def wait_s(self, visitor: str, per_minute: int, record: bool = False, now: float | None = None) -> float:
        """Seconds until `visitor` may start another (0: now); with `record`, a start now is counted."""
        if per_minute <= 0:
            return 0.0
        now = time.monotonic() if now is None else now
        with self._lock:
            starts = self._starts.setdefault(visitor, collections.deque())
            while starts and now - starts[0] >= self.WINDOW_S:
                starts.popleft()
            if len(starts) >= per_minute:
                return max(0.1, self.WINDOW_S - (now - starts[0]))
            if record:
                starts.append(now)
            if len(self._starts) > self.MAX_VISITORS:  # forget idle visitors
                for name in [v for v, d in self._starts.items() if not d or now - d[-1] >= self.WINDOW_S]:
                    del self._starts[name]
            return 0.0

    def clear(self) -> None:
        with self._lock:
            self._starts.clear()


class Slots:
    """At most `n` heavy computations at once in this server (0: no limit); reentrant per thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self.running = 0
        self.peak = 0
        self._held = threading.local()

    def acquire(self, n: int, timeout: float) -> bool:
        if getattr(self._held, "depth", 0):
            self._held.depth += 1
            return True
        with self._cond:
            if n > 0 and self.running >= n:
                self._cond.wait(timeout)
                if self.running >= n:
                    return False
            self.running += 1
            self.peak = max(self.peak, self.running)
        self._held.depth = 1
        return True

    def release(self) -> None:
        self._held.depth -= 1
        if self._held.depth:
            return
        with self._cond:
            self.running -= 1
            self._cond.notify()


_LIMITER = RateLimiter()
SLOTS = Slots()


def visitor_id() -> str:
    """Whom a limit counts against: the signed-in user, else the visitor's address (X-Forwarded-For's
    first one behind a trusted proxy), else the browser session (loopback visitors have no address)."""
    user = signed_in_user()
    if user:
        return f"user:{user}"
    address = None
    if settings().trust_proxy:
        with contextlib.suppress(Exception):
            forwarded = st.context.headers.get("X-Forwarded-For", "")
            address = forwarded.split(",")[0].strip() if isinstance(forwarded, str) else None
    if address is None:
        with contextlib.suppress(Exception):
            address = st.context.ip_address
    if isinstance(address, str) and address:
        return f"ip:{address}"
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return f"session:{ctx.session_id if ctx is not None else 'none'}"


def _texts(value: Any, out: list[str], depth: int = 0) -> list[str]:
    """Every string in a settings object (dataclass fields, lists, dicts), for the prompt limit."""
    import dataclasses

    if depth > 6:
        return out
    if isinstance(value, str):
        out.append(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _texts(getattr(value, f.name), out, depth + 1)
    elif isinstance(value, dict):
        for v in value.values():
            _texts(v, out, depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _texts(v, out, depth + 1)
    return out


def check_texts(*texts: str) -> None:
    """A page's own free text (a prompt it runs itself) above the longest prompt: one line, page stopped."""
    problem = settings().prompt_problem([t for t in texts if isinstance(t, str)])
    if problem:
        st.error(problem, icon=":material/text_fields:")
        st.stop()


def check_run(key, handle, params) -> None:
    """components/runs.py's guard, before anything is estimated or computed: a text above the
    longest prompt, or a visitor over the per-minute limit, gets one line and a stopped page."""
    config = settings()
    check_texts(*_texts(params, []))
    wait = _LIMITER.wait_s(visitor_id(), config.limits.runs_per_minute)
    if wait:
        _over_limit(config, wait)


def _over_limit(config: cfg.Config, wait: float) -> None:
    at = time.strftime("%H:%M:%S", time.localtime(time.time() + wait))
    st.warning(f"You have started {config.limits.runs_per_minute} analyses in the last minute, the most this "
               f"instance allows per visitor. You can run again in {wait:.0f} s (at {at}). Results other "
               "visitors have computed, and the shipped default views, still open at once.",
               icon=":material/hourglass_top:")
    st.stop()


@contextlib.contextmanager
def run_slot(label: str) -> Iterator[None]:
    """Around one heavy computation: counts it against the visitor's per-minute limit and waits for
    one of the server's `limits.concurrent_runs` slots, saying so while it waits (a visitor who
    leaves stops the wait: the notice is redrawn every second, where Streamlit stops a run)."""
    config = settings()
    wait = _LIMITER.wait_s(visitor_id(), config.limits.runs_per_minute, record=True)
    if wait:  # another tab of the same visitor got there first
        _over_limit(config, wait)
    n = config.limits.concurrent_runs
    notice, t0 = None, time.monotonic()
    while not SLOTS.acquire(n, timeout=1.0):
        notice = notice or st.empty()
        notice.info(f"{label.rstrip(' .')}: all {n} analysis slots of this server are busy; yours starts as "
                    f"soon as one is free (waiting {time.monotonic() - t0:.0f} s).", icon=":material/hourglass_top:")
    if notice is not None:
        notice.empty()
    try:
        yield
    finally:
        SLOTS.release()
