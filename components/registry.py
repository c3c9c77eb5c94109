"""The app's pages: one per panel of the panel table (analysis/framework/panels.py), then the saved-analyses gallery."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from analysis.framework import config
from analysis.framework import panels
from analysis.framework.paths import ROOT, VIEWS


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
    """A page per panel that has one (in the table's order), then the gallery."""
    out = [Panel(a.page, a.title, a.icon, a.summary, a.paper, a.kinds, a.name)
           for a in panels.analyses() if a.page]
    return out + [SAVED]


PANELS = panel_pages()  # as the table stood at import; app.py and the home page read the table at each run
