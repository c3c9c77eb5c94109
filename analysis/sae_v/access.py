"""What this instance lets a locator reach: SAE and data locators obey the deployment configuration's model
allow-list (analysis/framework/config.py), checked here in analysis code before anything is read or fetched, so the
page, a shared link and the command line are held to it alike.

- `sae-lens:RELEASE/SAE_ID` fetches from the Hugging Face Hub: only where `models.sources` has "hub" (and,
  with a `models.hub_models` list, only for the repositories on it), whatever HF_HUB_OFFLINE says;
- a folder or file on the server (an SAE, data, `file:` images): only where `models.sources` has "local",
  and then only under the allowed roots (MODEL_INSPECTOR_ROOTS or `models.local_folders`);
- `upload:SHA` data: only where uploads are on.

Every refusal names the locator as the visitor wrote it and nothing of the server: no resolved path, no
list of allowed folders, and the same words whether a refused path exists or not.
"""
from __future__ import annotations

import re
from pathlib import Path

from analysis.framework import config
from analysis.framework.errors import SettingsError

RELEASE_PREFIX = "sae-lens:"
PATH_LIKE = re.compile(r"(?:[A-Za-z]:)?(?:[/\\][^\s'\"/\\:]+){2,}[/\\]?")  # /a/b, C:\a\b: a server path


class RefusedLocator(SettingsError):
    """A locator this instance does not let a visitor use; the message names the locator as written."""


def shown(locator: str, n: int = 120) -> str:
    """A locator as the visitor wrote it, for messages (an upload by what it is, long text cut)."""
    text = " ".join(str(locator).split())
    if text.startswith("upload:"):
        return "the uploaded zip"
    return text if len(text) <= n else text[:n - 1] + "…"


def without_paths(text: str) -> str:
    """A message from a library with any server path in it replaced by '…' (e.g. sae-lens's loader errors)."""
    return PATH_LIKE.sub("…", str(text))


def _config() -> config.Config:
    try:
        return config.current()
    except config.ConfigError:
        raise RefusedLocator("This server's configuration is invalid; nothing can be read until it is fixed.") \
            from None


def check_release(locator: str) -> tuple[str, str]:
    """(release, SAE id) of a `sae-lens:` locator this instance may fetch; RefusedLocator otherwise."""
    text = str(locator).strip()
    release, _, sae_id = text[len(RELEASE_PREFIX):].partition("/")
    cfg = _config()
    if "hub" not in cfg.models.sources:
        raise RefusedLocator(f"'{shown(text)}' is a pretrained SAE on the Hugging Face Hub, and this instance does not "
                             "fetch from the Hub: use an SAE it offers.")
    if not release or not sae_id:
        raise RefusedLocator(f"A pretrained SAE is named sae-lens:RELEASE/SAE_ID, got '{shown(text)}'.")
    allowed = cfg.hub_allow_list()
    if allowed is not None and _release_repo(release, sae_id) not in allowed:
        raise RefusedLocator(f"'{shown(text)}' is not among the Hub repositories this instance fetches from.")
    return release, sae_id


def _release_repo(release: str, sae_id: str) -> str | None:
    """The Hub repository of a sae-lens release (from sae-lens's own list, read locally); None if unknown."""
    try:
        from sae_lens.loading.pretrained_saes_directory import get_repo_id_and_folder_name
    except ImportError:  # pragma: no cover - an older sae-lens
        return None
    try:
        return get_repo_id_and_folder_name(release, sae_id)[0]
    except Exception:  # an unknown release or id: not on any list
        return None


def server_path(locator: str, what: str) -> Path:
    """The server folder or file a locator names, when this instance reads server paths and it lies under the
    allowed roots; RefusedLocator (one message, whether the path exists or not) otherwise. `what`: "an SAE
    folder", "data", "an image"."""
    from analysis.model_access.models import allowed_roots

    text = str(locator).strip()
    if not text:
        raise RefusedLocator(f"Enter the path of {what}.")
    cfg = _config()
    if "local" not in cfg.models.sources:
        raise RefusedLocator(f"'{shown(text)}' names a path on the server, and this instance reads no server "
                             f"folders: choose {what} it offers.")
    try:
        roots = allowed_roots()
    except Exception:
        roots = []
    try:  # a name the file system refuses (5,000 characters, a NUL) is refused like any other (#39.9)
        path = Path(text).expanduser().resolve()
        if path.exists() and any(path == r or r in path.parents for r in roots):
            return path
    except (OSError, ValueError, RuntimeError):
        pass
    hint = " (the folders it may read are set by MODEL_INSPECTOR_ROOTS)" if not cfg.path else ""
    raise RefusedLocator(f"'{shown(text)}' is not {what} this server can read{hint}.")


def check_uploads() -> None:
    if not _config().uploads.enabled:
        raise RefusedLocator("Uploads are turned off on this instance, so uploaded data cannot be used.")
