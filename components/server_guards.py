"""Limits that Streamlit's own server has to apply, where no page runs: installed by scripts/serve.py
before the server starts (`install()`), from the deployment configuration (docs/deploy.md).

- Uploads held in memory: Streamlit keeps every file a browser PUTs to its upload endpoint until the
  session ends, whether or not a page ever reads it. `BoundedUploads` refuses (HTTP 413, before storing)
  a file beyond `uploads.files` per visitor, beyond `uploads.visitor_mb` per visitor (every tab and
  session of one address together), or beyond `uploads.total_mb` for the whole server.
- The sign-in route: when the OIDC provider cannot be reached, Streamlit answers a bare 400
  "Authentication error". That page becomes one that says so and links back to the app.
- The visitor's address: uvicorn replaces the connection's address with X-Forwarded-For's when the
  connection comes from loopback. The app decides that itself (`proxy_hops`, components/hosting.py), so
  uvicorn is told to trust no forwarding header (FORWARDED_ALLOW_IPS is emptied).

These replace two private pieces of Streamlit 1.67 (its upload manager class and its login handler,
pinned in requirements.txt); tests/service/test_public_server.py drives both through a real server.
"""
from __future__ import annotations

import html
import os

from streamlit.runtime.memory_uploaded_file_manager import MemoryUploadedFileManager
from streamlit.runtime.uploaded_file_manager import UploadedFileRec

from analysis.framework import config as cfg


class BoundedUploads(MemoryUploadedFileManager):
    """Streamlit's in-memory upload store, with the configuration's count and byte limits per visitor (all
    their tabs and sessions together: one visitor with 30 tabs held 495 of 500 MB when it was per session)."""

    def add_file(self, session_id: str, file: UploadedFileRec) -> None:
        from starlette.exceptions import HTTPException

        limits = cfg.current().uploads
        visitor = session_visitor(session_id)
        with self._lock:
            held = {(sid, fid): f for sid, files in self.file_storage.items()
                    if sid == session_id or session_visitor(sid) == visitor for fid, f in files.items()}
            replaced = held.pop((session_id, file.file_id), None)
            total = self._total_bytes - (len(replaced.data) if replaced else 0)
            visitor_bytes = sum(len(f.data) for f in held.values())
            problem = ""
            if limits.files and len(held) + 1 > limits.files:
                problem = (f"your open pages already hold {len(held)} uploaded files, the most one visitor may upload "
                           f"at once ({limits.files}); remove one first")
            elif limits.visitor_mb and visitor_bytes + len(file.data) > limits.visitor_mb * 2**20:
                problem = f"your uploads would pass {limits.visitor_mb} MB, the most one visitor may upload"
            elif limits.total_mb and total + len(file.data) > limits.total_mb * 2**20:
                problem = "the server holds as many uploads as it takes; try again later"
        if problem:
            raise HTTPException(status_code=413, detail=problem)
        super().add_file(session_id, file)


def session_visitor(session_id: str) -> str:
    """The visitor a session belongs to, counted as the pages count them (components/hosting.py: the address
    the trusted proxies report, an IPv6 address by its /64); the session itself when it has no connection."""
    from components import hosting

    try:
        from streamlit import runtime

        context = runtime.get_instance().get_client(session_id).client_context
        chain = [part.strip() for key, value in context.headers if key.lower() == "x-forwarded-for"
                 for part in str(value).split(",") if part.strip()]
        peer = context.remote_ip
    except Exception:  # no runtime, a session that has gone, a client without a context
        return f"session:{session_id}"
    return hosting.address_key(hosting.client_address(peer, chain, cfg.current().proxy_hops))


SIGN_IN_UNAVAILABLE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sign-in unavailable</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{{font-family:system-ui,sans-serif;max-width:36rem;margin:4rem auto;padding:0 1rem;color:#222}}
a{{color:#1f6feb}}</style></head>
<body><h1>Sign-in is not available right now</h1>
<p>The sign-in provider could not be reached from this server. Nothing was lost: every page that does not
need sign-in still opens.</p>
<p><a href="{back}">Back to Model Inspector</a></p></body></html>
"""


def _friendly_login(original):
    async def login(request, base_url: str):
        response = await original(request, base_url)
        if getattr(response, "status_code", 200) != 400:
            return response
        from starlette.responses import HTMLResponse

        from streamlit.url_util import make_url_path

        back = html.escape(make_url_path(base_url, "/"), quote=True)
        return HTMLResponse(SIGN_IN_UNAVAILABLE.format(back=back), status_code=503)

    login.guarded = True
    return login


def install() -> None:
    """Put the guards in place (before Streamlit's server is created)."""
    from streamlit.web.server import server as st_server
    from streamlit.web.server.starlette import starlette_auth_routes

    st_server.MemoryUploadedFileManager = BoundedUploads
    if not getattr(starlette_auth_routes._auth_login, "guarded", False):
        starlette_auth_routes._auth_login = _friendly_login(starlette_auth_routes._auth_login)
    os.environ["FORWARDED_ALLOW_IPS"] = ""  # the app reads X-Forwarded-For itself (proxy_hops)
