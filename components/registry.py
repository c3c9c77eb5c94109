"""The app's pages: one per panel of the panel table (analysis/framework/panels.py), in the README's order, then
the saved-analyses gallery; and what model each panel opens on when the loaded one cannot show it (`opens_on`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from analysis.framework import config
from analysis.framework import panels
from analysis.framework.paths import ROOT, VIEWS
from analysis.model_access.models import KIND_NAMES, ModelHandle, ModelSpec
from components.common import demo_model  # the deployment decides which demo models a visitor may load

# The sidebar's order: the README's panel table (a visitor reads the table, then the sidebar). Panels the
# table does not list yet follow in the panel table's order.
ORDER = ("sharpness", "kv", "invert", "sae", "captions", "residual")


@dataclass(frozen=True)
class Panel:
    page: str  # file under views/ (or an absolute path)
    title: str
    icon: str
    summary: str
    paper: str
    kinds: tuple[str, ...]  # model kinds it works on
    name: str = ""  # the analysis' name in the panel table ("" for pages that are not panels)

    @property
    def path(self) -> Path:
        return VIEWS / self.page

    @property
    def script(self) -> str:
        """The page as st.Page and st.page_link name it: relative to app.py when it lives in views/."""
        try:
            return str(self.path.resolve().relative_to(ROOT))
        except ValueError:
            return str(self.path)

    @property
    def url_path(self) -> str:
        # Page files live in views/, not pages/: with a pages/ folder beside app.py Streamlit runs the
        # first session in its legacy mode, which shows "Page not found" on every deep link.
        return Path(self.page).name.removesuffix(".py").replace("_", "-")

    @property
    def available(self) -> bool:
        """The page exists and the deployment configuration does not hide it (`panels.hidden`)."""
        return self.path.is_file() and config.current().panel_shown(self.url_path)


SAVED = Panel("saved_analyses.py", "Saved analyses", ":material/bookmarks:",
              "Analyses saved from any panel, reopened by permalink without recomputing.", "", ("causal_lm", "vlm"))


def panel_pages() -> list[Panel]:
    """A page per panel that has one (in the README's order), then the gallery."""
    out = [Panel(a.page, a.title, a.icon, a.summary, a.paper, a.kinds, a.name)
           for a in panels.analyses() if a.page]
    out.sort(key=lambda p: ORDER.index(p.name) if p.name in ORDER else len(ORDER))
    return out + [SAVED]


def _no_ready_view(name: str, handle: ModelHandle) -> str | None:
    """Why `handle` opens panel `name` on an empty state rather than a view (None: it shows one)."""
    if name == "sae":
        from analysis import sae_v  # the SAE-V page's list of SAEs: empty means a training form only

        if not sae_v.available_saes(handle):
            return f"there is no SAE for {handle.spec.label} yet (train one on this page)"
    return None


def opens_on(analysis: panels.Analysis, handle: ModelHandle) -> tuple[ModelSpec, str] | None:
    """The demo model a panel opens on instead of `handle`, and why, when `handle` cannot show the panel's
    view (another kind of model, or nothing ready for it: SAE-V without an SAE); None when it can, or when
    no demo model that could is installed (the page then says what is missing)."""
    if handle.kind not in analysis.kinds:
        why = f"it needs {' or '.join(KIND_NAMES[k] for k in analysis.kinds)}"
    else:
        why = _no_ready_view(analysis.name, handle)
    if why is None:
        return None
    demo = demo_model(*[k for k in ("vlm", "causal_lm") if k in analysis.kinds])
    if demo is None or demo == handle.spec:
        return None
    return demo, why


PANELS = panel_pages()  # as the table stood at import; app.py and the home page read the table at each run
