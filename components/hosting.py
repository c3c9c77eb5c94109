"""What a hosted instance adds to the pages: the configuration in force, sign-in, embeds, upload checks,
who the visitor is, and what a visitor may be shown.

All of it is driven by the deployment configuration (`analysis/framework/config.py`, docs/deploy.md); with no
configuration file every function here leaves the app exactly as a local run always was.

- `settings()`: the configuration, or a clear message and a stopped page when the file is bad.
- `sign_in_gate()`: app.py calls it first in every script run (it marks the run: one view's runs count
  once against the per-minute limit); with `auth.mode` "token" or "oidc" it shows the sign-in form and
  stops the page for a signed-out visitor unless `auth.signed_out = "read-only"`.
- `is_embedded()` / `embed_page()`: `?embed=true` shows the view only (no sidebar, controls or share bar).
- `visitor_id()`: whom a limit counts against and who owns a save: an OIDC account, else the visitor's
  address (the entry the trusted proxies added to X-Forwarded-For, else the connection's own; IPv6 by its
  /64), never a name typed with the access token and never the browser session.
- `file_uploader(...)`: `st.file_uploader` that refuses what the configuration refuses (off, size,
  not an image or not a zip, pixels, decompression bombs) with one line, before the page decodes anything.
- `visible(text)` / `escape_markdown(text)`: user and error text as a visitor may see it (plain text; on a
  public instance without operator instructions and server paths).

The limits on heavy work (runs per minute, slots, the largest run, training) are components/limits.py;
the limits Streamlit's own server must apply (uploads held in memory, the sign-in error page) are
components/server_guards.py, installed by scripts/serve.py.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import hmac
import html
import ipaddress
import re
import secrets
import threading
import time
from typing import Any

import streamlit as st

from analysis.framework import config as cfg

USER_KEY = "_mi_user"  # {"name": ..., "via": "token" | "oidc"} once signed in with the access token


def settings() -> cfg.Config:
    """The deployment configuration; a bad file stops the page with one line (never a traceback)."""
    try:
        return cfg.current()
    except cfg.ConfigError as exc:
        st.error(f"This server's configuration is invalid: {visible_markdown(str(exc))}", icon=":material/error:")
        st.stop()
        raise  # st.stop raises; this keeps type checkers quiet


# Streamlit's Markdown (GFM) turns bare URLs, www. names and e-mail addresses into links even where every
# character is backslash-escaped: a word joiner (U+2060, invisible) after the scheme's ':', after 'www'
# and after '@' keeps them text.
_AUTOLINKS = [(re.compile(r"(?i)\b(https?|ftp|mailto|javascript|data|file):"), "\\1:\u2060"),
              (re.compile(r"(?i)\b(www)\."), "\\1\u2060."), (re.compile("@"), "@\u2060")]


def escape_markdown(text: str) -> str:
    """User text shown through Markdown as plain text: no links (bare URLs and addresses included),
    emphasis, images, HTML or directives."""
    text = html.escape(str(text).replace("\n", " "), quote=False)
    for pattern, repl in _AUTOLINKS:
        text = pattern.sub(repl, text)
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|~:$<>@=?/%])", r"\\\1", text)


# What only the person running the server can act on: said to them (the log, the command line), never
# to a visitor of a public instance.
_OPERATOR_HINTS = re.compile(r"MODEL_INSPECTOR_\w+|pip install|python -m |requirements\.txt|\.streamlit/|"
                             r"docs/deploy\.md|secrets\.toml|HF_HUB_OFFLINE", re.I)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@functools.lru_cache(maxsize=1)
def _server_prefixes() -> tuple[str, ...]:
    """Folders whose names tell a visitor how this server is laid out (the checkout, home, caches, temp)."""
    import os
    import sys
    import tempfile
    from pathlib import Path

    from analysis.framework.paths import ROOT

    found = {str(ROOT), str(Path.home()), tempfile.gettempdir(), sys.prefix, sys.base_prefix,
             os.environ.get("MODEL_INSPECTOR_CACHE", ""), "/usr/", "/opt/", "/srv/", "/var/", "/proc/", "/home/"}
    return tuple(sorted((p.rstrip("/") for p in found if p and p != "/"), key=len, reverse=True))


def visible(text: str) -> str:
    """A message as a visitor may read it. On a public instance (`public = true`) the sentences that are
    instructions for the operator (environment variables, pip, config files) are left out and server
    paths are replaced; elsewhere it is unchanged (the person at the keyboard runs the server)."""
    text = str(text)
    try:
        public = cfg.current().public
    except cfg.ConfigError:
        public = True  # a broken configuration: say as little as possible
    if not public:
        return text
    kept = [part for part in _SENTENCE_END.split(text) if part.strip() and not _OPERATOR_HINTS.search(part)]
    text = " ".join(kept).strip() or "This cannot be used on this instance."
    for prefix in _server_prefixes():
        text = re.sub(re.escape(prefix) + r"(?![\w.-])(?:/[^\s'\",;)]*)?", "[a server folder]", text)
    return text


def visible_markdown(text: str) -> str:
    """`visible(text)` escaped for Markdown: what every error line built from an exception or user input shows."""
    return escape_markdown(visible(text))


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
    _new_script_run()
    config = settings()
    if config.public:  # however the server was started (scripts/serve.py passes it too): no traceback shown
        with contextlib.suppress(Exception):
            if st.get_option("client.showErrorDetails") not in ("none", False, "false"):
                st.set_option("client.showErrorDetails", "none")
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
            st.error(visible_markdown("Sign-in is not set up on this server. The server has no [auth] section in "
                                      ".streamlit/secrets.toml; see docs/deploy.md."), icon=":material/error:")
            return
        if not _issuer_reachable(_issuer_url(config.auth.provider)):
            st.warning("Sign-in is not available right now: the sign-in provider cannot be reached. Every page "
                       "still opens; try signing in again in a minute.", icon=":material/cloud_off:")
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


def _issuer_url(provider: str) -> str:
    try:
        auth = st.secrets["auth"]
        section = auth[provider] if provider else auth
        return str(section.get("server_metadata_url", ""))
    except Exception:  # no secrets, no such provider
        return ""


ISSUER_CHECK_S = 30.0
_issuer_checks: dict[str, tuple[float, bool]] = {}


def _issuer_reachable(url: str) -> bool:
    """Whether the provider's metadata answers (checked at most every 30 s per URL): a visitor is sent to
    sign in only when the server can complete it; otherwise Streamlit answers a bare 'Authentication
    error' page (components/server_guards.py gives that page a way back, for the race)."""
    if not url:
        return True  # Streamlit reports a missing URL itself
    now = time.monotonic()
    hit = _issuer_checks.get(url)
    if hit is not None and now - hit[0] < ISSUER_CHECK_S:
        return hit[1]
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            ok = response.status < 400
    except Exception:  # unreachable, refused, TLS, a 4xx/5xx
        ok = False
    _issuer_checks[url] = (now, ok)
    return ok


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

# What each kind of upload is: the extensions the browser offers, what the content must be.
UPLOAD_KINDS = {"image": ("png", "jpg", "jpeg", "gif", "bmp", "webp"), "zip": ("zip",)}


def upload_limit_mb(kind: str = "image") -> float:
    """The largest file of this kind this instance takes (what the uploader's label says)."""
    limit = settings().uploads.max_mb
    if kind == "zip":
        from analysis.sae_v.userdata import zip_limit_bytes

        limit = zip_limit_bytes() / 2**20
    return limit


def file_uploader(label: str, key: str, kind: str = "image", where: Any = None, **kwargs) -> Any:
    """`st.file_uploader` under the configuration: None (with one line saying why) when uploads are
    off or this file is refused (too large, not of its kind, too many pixels, a decompression bomb);
    the pages' own checks still run after this one. The label gets the instance's real size limit.

    The accepted extensions are given to the browser as MIME types as well, so Streamlit does not check
    a file's name itself (it raises, and the visitor would see a traceback for a renamed file); the
    content is checked here instead. `where`: a column or container to draw into."""
    config = settings()
    where = st if where is None else where
    if not config.uploads.enabled:
        where.info("Uploads are turned off on this instance.", icon=":material/block:")
        return None
    extensions = UPLOAD_KINDS[kind]
    kwargs.pop("type", None)
    accept = [f".{e}" for e in extensions] + (["application/zip"] if kind == "zip" else
                                              [f"image/{e}" for e in extensions])
    label = f"{label} (up to {upload_limit_mb(kind):g} MB)"
    upload = where.file_uploader(label, key=key, type=accept, **kwargs)
    if upload is None:
        return None
    problem = upload_problem(upload.getvalue(), upload.name, kind)
    if problem:
        where.error(visible_markdown(problem), icon=":material/error:")
        return None
    return upload


def upload_problem(data: bytes, name: str, kind: str = "image") -> str | None:
    """Why this file is refused as an upload of `kind`, or None."""
    config = settings()
    if kind == "image":
        return config.upload_problem(data, name)
    limit = upload_limit_mb(kind)
    if len(data) > limit * 2**20:
        return f"'{name[:60]}' is {len(data) / 2**20:.1f} MB; files up to {limit:g} MB are accepted here."
    if kind == "zip" and not data.startswith(b"PK"):
        return f"'{name[:60]}' is not a zip file."
    return None


def upload_owner() -> str:
    """Whose upload this is, for the upload area's per-visitor limits (analysis/framework/uploads.py)."""
    return visitor_id()


# ---------------------------------------------------------------------------------------------
# Who the visitor is


class RateLimiter:
    """Events per visitor over the last minute (one server; each replica counts its own). An event may
    carry a token: events with the same token count once (one view's several runs)."""

    WINDOW_S = 60.0
    MAX_VISITORS = 10_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: dict[str, collections.deque] = {}

    def wait_s(self, visitor: str, per_minute: int, record: bool = False, now: float | None = None,
               token: str | None = None) -> float:
        """Seconds until `visitor` may start another (0: now); with `record`, a start now is counted
        (once per `token`: a start with a token already counted is free)."""
        if per_minute <= 0:
            return 0.0
        now = time.monotonic() if now is None else now
        with self._lock:
            starts = self._starts.setdefault(visitor, collections.deque())
            while starts and now - starts[0][0] >= self.WINDOW_S:
                starts.popleft()
            if token is not None and any(t == token for _, t in starts):
                return 0.0
            if len(starts) >= per_minute:
                return max(0.1, self.WINDOW_S - (now - starts[0][0]))
            if record:
                starts.append((now, token))
            if len(self._starts) > self.MAX_VISITORS:  # forget idle visitors
                for name in [v for v, d in self._starts.items() if not d or now - d[-1][0] >= self.WINDOW_S]:
                    del self._starts[name]
            return 0.0

    def clear(self) -> None:
        with self._lock:
            self._starts.clear()


_LIMITER = RateLimiter()  # sign-in attempts; components/limits.py keeps the runs' and saves' own
RUN_TOKEN = "_mi_run"


def _new_script_run() -> None:
    """Marks this script run: the heavy runs one view starts count once against the per-minute limit."""
    with contextlib.suppress(Exception):
        st.session_state[RUN_TOKEN] = secrets.token_hex(8)


def script_run_token() -> str | None:
    """This script run's mark (None where app.py did not run: a page on its own counts each run)."""
    try:
        return st.session_state.get(RUN_TOKEN)
    except Exception:
        return None


def _peer() -> str | None:
    """The address of the connection this session's websocket came in on (the TCP peer, loopback
    included; scripts/serve.py keeps uvicorn from replacing it with a header's)."""
    from streamlit import runtime
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    if ctx is None or not runtime.exists():
        return None
    client = runtime.get_instance().get_client(ctx.session_id)
    address = getattr(getattr(client, "client_context", None), "remote_ip", None)
    return address if isinstance(address, str) and address else None


def forwarded_chain() -> list[str]:
    """Every X-Forwarded-For entry of this session's websocket request, left to right."""
    try:
        values = st.context.headers.get_all("X-Forwarded-For")
    except Exception:  # no browser context
        return []
    return [part.strip() for value in values for part in str(value).split(",") if part.strip()]


def client_address(peer: str | None, chain: list[str], hops: int) -> str:
    """The visitor's address: with `hops` trusted proxies, the entry the outermost of them appended
    (`hops` places from the right; what the visitor wrote themselves is further left and ignored), else
    the connection's own. A connection from a public address did not come through a proxy of ours:
    its header is the visitor's own writing and is ignored."""
    if hops and peer is not None and len(chain) >= hops and not _is_public(peer):
        return chain[-hops]
    return peer or "local"


def _is_public(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_global
    except ValueError:
        return False


def address_key(address: str) -> str:
    """An address as one visitor: an IPv6 address by its /64 (one household or phone holds a whole /64
    and picks any address in it), an IPv4-mapped one as its IPv4 address, anything else as given."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return address
    if ip.version == 6:
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def visitor_id() -> str:
    """Whom a limit counts against: the verified account of an OIDC sign-in, else the visitor's address
    (`client_address`, an IPv6 address by its /64). Never a name the visitor typed (with the shared access
    token anyone can type "alice", and each new name would be a fresh budget) and never the browser
    session: a new tab or a new session is the same visitor."""
    if settings().auth.mode == "oidc":
        user = signed_in_user()
        if user:
            return f"user:{user}"
    return f"ip:{address_key(client_address(_peer(), forwarded_chain(), settings().proxy_hops))}"


def check_texts(*texts: str) -> None:
    """A page's own free text (a prompt it runs itself) above the longest prompt: one line, page stopped."""
    problem = settings().prompt_problem([t for t in texts if isinstance(t, str)])
    if problem:
        st.error(problem, icon=":material/text_fields:")
        st.stop()
