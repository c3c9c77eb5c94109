"""Deployment configuration: one TOML file, plus environment variables for secrets.

    MODEL_INSPECTOR_CONFIG=deploy/public.toml python scripts/serve.py
    python -m analysis.framework.config [FILE]       # check a file and print the settings in force

The file is $MODEL_INSPECTOR_CONFIG, else `model_inspector.toml` in the working folder when there is
one; without a file every setting keeps its default, which is the local run as it always was (every
model source, uploads on, no sign-in, a writable gallery, every panel). docs/deploy.md is the
reference; `deploy/public.toml` is the example for a public instance.

Environment variables that existed before the file still work and win over it:
MODEL_INSPECTOR_STORE (the store: a SQLite path or a postgresql:// URL), MODEL_INSPECTOR_ROOTS,
MODEL_INSPECTOR_MAX_PARAMS. Secrets never go in the file: MODEL_INSPECTOR_ACCESS_TOKEN (the shared
access token) and Streamlit's own `.streamlit/secrets.toml` (OIDC client secret, cookie secret).

This module reads settings and answers questions about them ("may this model be loaded?", "is
this upload acceptable?"); it never imports Streamlit, so the analysis modules and the command
line can use it too.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG_ENV = "MODEL_INSPECTOR_CONFIG"
DEFAULT_FILE = "model_inspector.toml"
TOKEN_ENV = "MODEL_INSPECTOR_ACCESS_TOKEN"
SOURCES = ("zoo", "hub", "local")
SOURCE_NAMES = {"zoo": "the demo zoo", "hub": "the Hugging Face Hub", "local": "local folders"}
AUTH_MODES = ("none", "token", "oidc")
SIGNED_OUT = ("read-only", "none")


class ConfigError(ValueError):
    """The configuration file is missing, unreadable or has a bad value; the message says which."""


@dataclass(frozen=True)
class Models:
    sources: tuple[str, ...] = SOURCES  # where models may come from
    hub_models: tuple[str, ...] = ("*",)  # Hub ids that may be loaded; "*": any
    local_folders: tuple[str, ...] = ()  # folders local models may live under; (): $MODEL_INSPECTOR_ROOTS or zoo + cwd
    max_params: int = 3_000_000_000  # the largest model, in parameters (checked before any weight is read)
    default: str = "zoo:shapes-lm"  # what a visitor gets first, and instead of a refused model


@dataclass(frozen=True)
class Uploads:
    enabled: bool = True
    max_mb: float = 20.0  # one file (an image or a data zip); also Streamlit's server.maxUploadSize (scripts/serve.py)
    max_pixels: int = 0  # refused above this from the header, before decoding; 0: the pages' own limits only
    files: int = 0  # files one visitor may keep on the server at once (and one session hold in memory); 0: no limit
    visitor_mb: int = 0  # what one visitor's uploads may take, on disk (a zip unpacked) and held in memory; 0: no limit
    total_mb: int = 0  # what every visitor's uploads together may take on disk (and in memory); 0: no limit
    keep_seconds: int = 0  # an upload is deleted this long after it arrived; 0: kept


TRAINING = ("everyone", "signed-in", "nobody")


@dataclass(frozen=True)
class Limits:
    max_prompt_chars: int = 0  # the longest text an analysis accepts; 0: no limit
    concurrent_runs: int = 0  # heavy analyses running at once on this server; 0: no limit
    runs_per_minute: int = 0  # views with heavy analyses one visitor may start per minute; 0: no limit
    visitor_runs: int = 0  # of the concurrent runs, how many one visitor may hold at once; 0: no share
    max_run_seconds: int = 0  # the longest run (estimated on this machine) that is started at all; 0: no limit
    training: str = "everyone"  # who may train (an SAE: written where every visitor sees it): everyone | signed-in | nobody
    saves_per_minute: int = 0  # analyses one visitor may save per minute; 0: no limit
    # Memory (MiB, estimated before a run starts from the same counts as its time, analysis/framework/cost.py):
    max_run_mb: int = 0  # the most one run may add to the server's memory at its peak; 0: no limit
    server_mb: int = 0  # the server's budget: resident now plus the runs in flight plus a new one; 0: no limit


@dataclass(frozen=True)
class Gallery:
    writable: bool = True  # False: saved analyses open, nobody saves or deletes


@dataclass(frozen=True)
class Panels:
    hidden: tuple[str, ...] = ()  # url paths of panels not offered (e.g. "caption-correction")


@dataclass(frozen=True)
class Embeds:
    # True: ?embed=true (and a saved analysis's embed link) shows the view alone. A host whose own page
    # always adds ?embed=true to the app's address would then hide the controls there too: set false.
    enabled: bool = True


@dataclass(frozen=True)
class Auth:
    mode: str = "none"  # none | token (shared access token) | oidc (st.login)
    provider: str = ""  # oidc: the provider's name under [auth] in .streamlit/secrets.toml ("" : the default)
    signed_out: str = "read-only"  # read-only: signed-out visitors see every page, save nothing; none: sign in first


# -- [backend]: where the capture-based panels run (analysis/backends/; docs/scale.md) ------------
BACKEND_KINDS = ("local", "nnsight-local", "ndif")


@dataclass(frozen=True)
class Backend:
    kind: str = "local"  # local: hooks here | nnsight-local: nnsight traces here | ndif: remote_models on NDIF
    ndif_host: str = ""  # "": nnsight's default (https://api.ndif.us); never holds a key (NDIF_API_KEY does)
    remote_models: tuple[str, ...] = ()  # Hub ids visitors may run on NDIF (kind = "ndif")
    timeout_s: float = 600.0  # give up waiting for one NDIF job after this long
    poll_s: float = 1.0  # how often to ask NDIF about a job (and update the page)
    job_s: float = 5.0  # what one NDIF job is expected to take, queue and transfer included (estimates only)


def _check_backend(backend: Backend, where: str) -> None:
    """The [backend] section's own checks (one function: the rest of this module does not know it)."""
    from urllib.parse import urlsplit

    if backend.kind not in BACKEND_KINDS:
        raise ConfigError(f"backend.kind{where} must be one of {', '.join(BACKEND_KINDS)}, got '{backend.kind}'")
    if backend.ndif_host:
        url = urlsplit(backend.ndif_host)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ConfigError(f"backend.ndif_host{where} must be an http(s) address, got '{_short(backend.ndif_host)}'")
        if url.username or url.password or url.query or url.fragment:
            raise ConfigError(f"backend.ndif_host{where} must be a bare address: the NDIF API key goes in the "
                              "environment (NDIF_API_KEY) or Streamlit secrets, never in a URL")
    bad = [m for m in backend.remote_models if not _hub_id(m)]
    if bad:
        raise ConfigError(f"backend.remote_models{where} must be Hugging Face ids (owner/name), got '{_short(bad[0])}'")
    if backend.kind == "ndif" and not backend.remote_models:
        raise ConfigError(f"backend.kind is 'ndif'{where} but backend.remote_models is empty: list the Hub ids "
                          "visitors may run on NDIF")


def _hub_id(text: str) -> bool:
    import re

    return bool(re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$", text)) and ".." not in text
# -- end [backend] ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    models: Models = field(default_factory=Models)
    uploads: Uploads = field(default_factory=Uploads)
    limits: Limits = field(default_factory=Limits)
    gallery: Gallery = field(default_factory=Gallery)
    panels: Panels = field(default_factory=Panels)
    embeds: Embeds = field(default_factory=Embeds)
    auth: Auth = field(default_factory=Auth)
    backend: Backend = field(default_factory=Backend)
    store: str = ""  # SQLite path or postgresql:// URL; "": .model_inspector/analyses.db
    # Proxies in front of the server that append the address they saw to X-Forwarded-For (nginx's
    # $proxy_add_x_forwarded_for, Spaces): the visitor is the entry this many places from the right. 0: the
    # connection's own address (a server visitors reach directly: the header is theirs to forge).
    proxy_hops: int = 0
    # Visitors are strangers: no tracebacks, no operator instructions and no server paths in what a page
    # shows (scripts/serve.py also turns Streamlit's client.showErrorDetails off).
    public: bool = False
    name: str = "local"  # shown to the admin only (the command line, the server log)
    path: str = ""  # the file it came from ("" : the defaults)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    # -- questions the app asks ---------------------------------------------------------------

    def model_refusal(self, source: str, name: str) -> str | None:
        """Why this instance will not load `source:name`, in words for the visitor; None if it may.

        Only the configuration is consulted (nothing is read, resolved or downloaded): the folder's
        own checks (allowed roots after resolving symlinks, the parameter limit) come after, in
        analysis/model_access/models.py."""
        if source not in self.models.sources:
            offered = ", ".join(SOURCE_NAMES[s] for s in self.models.sources) or "no source"
            return f"This instance does not load models from {SOURCE_NAMES.get(source, repr(source))} (it offers {offered})."
        if source == "hub" and "*" not in self.models.hub_models and name not in self.models.hub_models:
            offered = ", ".join(self.models.hub_models) or "none"
            return f"'{_short(name)}' is not among the Hub models this instance offers ({offered})."
        return None

    def hub_allow_list(self) -> list[str] | None:
        """The Hub ids a visitor may pick from, or None when any id may be typed."""
        return None if "*" in self.models.hub_models else list(self.models.hub_models)

    def local_roots(self) -> list[Path] | None:
        """Configured local folders (resolved), or None for the default roots."""
        if not self.models.local_folders:
            return None
        base = Path(self.path).parent if self.path else Path.cwd()
        return [(base / Path(p).expanduser()).resolve() for p in self.models.local_folders]

    def read_only(self) -> bool:
        """Visitors change nothing every other visitor sees: no saves, no trained SAEs."""
        return not self.gallery.writable

    def training_refusal(self, signed_in: bool) -> str | None:
        """Why this visitor may not train here (training writes a model every visitor then sees); None if they may."""
        if self.read_only() or self.limits.training == "nobody":
            return "Training is turned off on this instance (what is trained here would be shown to every visitor)."
        if self.limits.training == "signed-in" and not signed_in:
            return "Training is for signed-in visitors on this instance."
        return None

    def panel_shown(self, url_path: str) -> bool:
        return url_path not in self.panels.hidden

    def upload_problem(self, data: bytes, name: str = "upload") -> str | None:
        """Why this upload is refused (off, too large, not an image, too many pixels, a
        decompression bomb), or None. Reads the image header only: nothing is decoded here."""
        return upload_problem(data, name, self.uploads)

    def prompt_problem(self, texts: list[str]) -> str | None:
        limit = self.limits.max_prompt_chars
        longest = max((len(t) for t in texts), default=0)
        if limit and longest > limit:
            return (f"The text is {longest:,} characters long; this instance accepts up to {limit:,}. "
                    "Shorten it and run again.")
        return None


def _short(text: str, n: int = 80) -> str:
    text = str(text)
    return text if len(text) <= n else text[:n - 1] + "…"


def upload_problem(data: bytes, name: str, uploads: Uploads) -> str | None:
    """The app's one upload decoder (analysis/framework/images.py) under this instance's limits: it reads the
    header first, so a file above the limits, or a decompression bomb, is refused undecoded."""
    from analysis.framework import images

    if not uploads.enabled:
        return "Uploads are turned off on this instance; use the demo scenes."
    try:
        images.open_image(data, f"'{_short(name, 60)}'", max_bytes=int(uploads.max_mb * 2**20),
                          max_pixels=uploads.max_pixels or images.MAX_IMAGE_PIXELS)
    except images.ImageError as exc:
        return str(exc)
    return None


# ---------------------------------------------------------------------------------------------
# Reading the file

_SECTIONS = {"models": Models, "uploads": Uploads, "limits": Limits, "gallery": Gallery, "panels": Panels,
             "embeds": Embeds, "auth": Auth, "backend": Backend}
_TOP = {"name": str, "store": str, "proxy_hops": int, "public": bool}
_RENAMED = {"trust_proxy": "trust_proxy was replaced by proxy_hops (the number of proxies in front of the server that "
                           "append to X-Forwarded-For: 1 behind one nginx or on Hugging Face Spaces, 0 when visitors "
                           "reach the server directly)"}


def config_path() -> Path | None:
    """The configuration file in force: $MODEL_INSPECTOR_CONFIG, else ./model_inspector.toml if present."""
    env = os.environ.get(CONFIG_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    local = Path.cwd() / DEFAULT_FILE
    return local if local.is_file() else None


def parse(text: str, path: str = "") -> Config:
    """A Config from TOML text; every key checked (an unknown key is an error: a typo in a safety
    setting must not silently leave it at its default)."""
    where = f" in {path}" if path else ""
    raw = _with_base(_toml(text, where), path, where)
    renamed = sorted(set(raw) & set(_RENAMED))
    if renamed:
        raise ConfigError(f"{_RENAMED[renamed[0]]}{where}")
    unknown = set(raw) - set(_SECTIONS) - set(_TOP)
    if unknown:
        raise ConfigError(f"unknown setting{where}: {', '.join(sorted(unknown))} "
                          f"(known: {', '.join(sorted(set(_SECTIONS) | set(_TOP)))})")
    parts: dict[str, Any] = {}
    for section, cls in _SECTIONS.items():
        values = raw.get(section, {})
        if not isinstance(values, dict):
            raise ConfigError(f"[{section}]{where} must be a table of settings")
        parts[section] = _section(section, cls, values, where)
    for key, kind in _TOP.items():
        if key in raw:
            parts[key] = _value(key, raw[key], kind, where)
    config = Config(**parts, path=path)
    _check(config, where)
    return config


def _toml(text: str, where: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"the configuration{where} is not valid TOML: {exc}") from None


def _with_base(raw: dict, path: str, where: str, seen: tuple[str, ...] = ()) -> dict:
    """`extends = "public.toml"` (a file beside this one): that file's settings, then this file's over them,
    key by key within each section, so a configuration shipped beside the public one keeps every public
    limit it does not name (deploy/ndif.toml)."""
    base = raw.pop("extends", None)
    if base is None:
        return raw
    if not isinstance(base, str) or not path:
        raise ConfigError(f"extends{where} must name a configuration file beside this one")
    base_path = (Path(path).parent / base).resolve()
    if str(base_path) in seen or len(seen) > 4:
        raise ConfigError(f"extends{where} makes a loop of configuration files")
    try:
        text = base_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        raise ConfigError(f"extends{where}: {base} cannot be read") from None
    merged = _with_base(_toml(text, f" in {base_path}"), str(base_path), f" in {base_path}", (*seen, str(base_path)))
    for key, value in raw.items():
        merged[key] = {**merged[key], **value} if isinstance(value, dict) and isinstance(merged.get(key), dict) \
            else value
    return merged


def _section(section: str, cls, values: dict, where: str):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(values) - set(fields)
    if unknown:
        raise ConfigError(f"unknown setting{where}: {', '.join(f'{section}.{k}' for k in sorted(unknown))} "
                          f"(known in [{section}]: {', '.join(fields)})")
    defaults = cls()
    kwargs = {}
    for name, value in values.items():
        kind = type(getattr(defaults, name))
        kwargs[name] = _value(f"{section}.{name}", value, kind, where)
    return cls(**kwargs)


def _value(key: str, value: Any, kind: type, where: str) -> Any:
    if kind is tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{key}{where} must be a list of strings, got {value!r}")
        return tuple(value)
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}{where} must be true or false, got {value!r}")
        return value
    if kind is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # 3e9
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{key}{where} must be a whole number >= 0, got {value!r}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"{key}{where} must be a number > 0, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ConfigError(f"{key}{where} must be a string, got {value!r}")
    return value


def _check(config: Config, where: str) -> None:
    bad = [s for s in config.models.sources if s not in SOURCES]
    if bad or not config.models.sources:
        raise ConfigError(f"models.sources{where} must be some of {', '.join(SOURCES)}, got {list(config.models.sources)}")
    source, _, name = config.models.default.partition(":")
    if source not in config.models.sources or not name:
        raise ConfigError(f"models.default{where} ('{config.models.default}') must be 'source:name' with an "
                          f"allowed source ({', '.join(config.models.sources)})")
    if config.model_refusal(source, name.partition("@")[0] if source == "hub" else name):
        raise ConfigError(f"models.default{where} ('{config.models.default}') is not among the allowed models")
    if config.auth.mode not in AUTH_MODES:
        raise ConfigError(f"auth.mode{where} must be one of {', '.join(AUTH_MODES)}, got '{config.auth.mode}'")
    if config.auth.signed_out not in SIGNED_OUT:
        raise ConfigError(f"auth.signed_out{where} must be one of {', '.join(SIGNED_OUT)}, got "
                          f"'{config.auth.signed_out}'")
    if config.limits.training not in TRAINING:
        raise ConfigError(f"limits.training{where} must be one of {', '.join(TRAINING)}, got '{config.limits.training}'")
    _check_backend(config.backend, where)
    if config.auth.mode == "token" and not os.environ.get(TOKEN_ENV):
        raise ConfigError(f"auth.mode is 'token'{where} but {TOKEN_ENV} is not set (the token is a secret: "
                          "it goes in the environment, not in the file)")


_CACHE: dict[tuple, Config] = {}


def current() -> Config:
    """The configuration in force (re-read when the file or the environment changes).

    The environment variables that predate the file win over it (MODEL_INSPECTOR_STORE,
    MODEL_INSPECTOR_MAX_PARAMS; MODEL_INSPECTOR_ROOTS is read by analysis/model_access/models.py)."""
    path = config_path()
    try:
        stamp = path.stat().st_mtime_ns if path is not None else None
    except OSError:
        raise ConfigError(f"the configuration file {path} ({CONFIG_ENV}) does not exist or cannot be read") from None
    env = tuple(os.environ.get(k) for k in ("MODEL_INSPECTOR_STORE", "MODEL_INSPECTOR_MAX_PARAMS", TOKEN_ENV))
    key = (str(path), stamp, env)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    if path is None:
        config = Config()
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"the configuration file {path} cannot be read: {exc}") from None
        config = parse(text, str(path))
    config = _with_env(config)
    _CACHE.clear()
    _CACHE[key] = config
    return config


def _with_env(config: Config) -> Config:
    store = os.environ.get("MODEL_INSPECTOR_STORE", "").strip()
    if store:
        config = dataclasses.replace(config, store=store)
    raw = os.environ.get("MODEL_INSPECTOR_MAX_PARAMS", "").strip()
    if raw:
        try:
            limit = int(float(raw))
        except ValueError:
            raise ConfigError(f"MODEL_INSPECTOR_MAX_PARAMS must be a number, got '{raw}'") from None
        config = dataclasses.replace(config, models=dataclasses.replace(config.models, max_params=limit))
    return config


OIDC_KEYS = ("client_id", "client_secret", "server_metadata_url")


def read_secrets(files: list[str | Path]) -> dict:
    """Streamlit's secrets files merged as Streamlit merges them (a later file's top-level keys win);
    a file that is absent is skipped, one that does not parse is an error."""
    merged: dict = {}
    for f in files:
        path = Path(f).expanduser()
        if not path.is_file():
            continue
        try:
            merged.update(tomllib.loads(path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"the secrets file {path} cannot be read: {exc}") from None
    return merged


def oidc_problem(config: Config, secrets: dict) -> str | None:
    """With auth.mode "oidc": what the [auth] secrets lack for Streamlit's sign-in (None when complete).
    scripts/serve.py refuses to start on it: an instance whose sign-in cannot work must not report healthy."""
    if config.auth.mode != "oidc":
        return None
    auth = secrets.get("auth")
    if not isinstance(auth, dict):
        return ("auth.mode is 'oidc' but the secrets have no [auth] section (.streamlit/secrets.toml, or the "
                "host's secrets settings); see docs/deploy.md")
    name = config.auth.provider
    provider = auth.get(name) if name else auth
    if not isinstance(provider, dict):
        return f"auth.provider is '{name}' but the secrets have no [auth.{name}] section"
    missing = [k for k in ("redirect_uri", "cookie_secret") if not auth.get(k)]
    missing += [k for k in OIDC_KEYS if not provider.get(k)]
    if missing:
        return f"the [auth{'.' + name if name else ''}] secrets lack {', '.join(missing)} (auth.mode is 'oidc')"
    return None


def access_token() -> str:
    return os.environ.get(TOKEN_ENV, "")


def cli(argv: list[str]) -> int:
    """Check a configuration file (or the one in force) and print the settings it gives, as JSON."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m analysis.framework.config", description=cli.__doc__)
    parser.add_argument("file", nargs="?", help=f"a TOML file (default: ${CONFIG_ENV}, else ./{DEFAULT_FILE})")
    args = parser.parse_args(argv)
    try:
        if args.file:
            path = Path(args.file)
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"cannot read {path}: {exc}") from None
            config = _with_env(parse(text, str(path)))
        else:
            config = current()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    shown = config.to_dict()
    if "://" in shown["store"]:  # never print a database password
        shown["store"] = _redact(shown["store"])
    print(json.dumps(shown, indent=2))
    return 0


def _redact(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not at:
        return url
    user = creds.partition(":")[0]
    return f"{scheme}{sep}{user}:***@{host}"


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
