"""The panels of the app. A panel appears in the navigation once its page file exists."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from analysis import config

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Panel:
    page: str  # file under views/
    title: str
    icon: str
    summary: str
    paper: str
    kinds: tuple[str, ...]  # model kinds it works on

    @property
    def path(self) -> Path:
        return ROOT / "views" / self.page

    @property
    def url_path(self) -> str:
        # Page files live in views/, not pages/: with a pages/ folder beside app.py Streamlit runs the
        # first session in its legacy mode, which shows "Page not found" on every deep link.
        return self.page.removesuffix(".py").replace("_", "-")

    @property
    def available(self) -> bool:
        """The page exists and the deployment configuration does not hide it (`panels.hidden`)."""
        return self.path.is_file() and config.current().panel_shown(self.url_path)


PANELS = [
    Panel("sae_features.py", "SAE-V features", ":material/scatter_plot:",
          "Sparse-autoencoder features of a multimodal model: which modality they fire on, "
          "cross-modal scores, and data filtering by those scores.",
          "SAE-V (ICML 2025)", ("vlm",)),
    Panel("attention_sharpness.py", "Attention sharpness", ":material/blur_on:",
          "Entropy and max weight of every head as inputs grow; temperature sweeps and the "
          "adaptive-temperature rule.",
          "Softmax is not enough (ICML 2025)", ("causal_lm", "vlm")),
    Panel("kv_cache.py", "KV-cache eviction", ":material/memory:",
          "Which cached tokens StreamingLLM, H2O, TOVA, SnapKV and MorphKV keep, step by step, and "
          "what it costs in quality and memory.",
          "MorphKV (ICML 2025)", ("causal_lm", "vlm")),
    Panel("caption_correction.py", "Caption correction", ":material/fact_check:",
          "Split a detailed caption into claims, verify each against the image, rewrite without "
          "the hallucinated ones.",
          "CapMAS (ICML 2025)", ("vlm",)),
    Panel("prompt_reconstruction.py", "Prompt reconstruction", ":material/lock_open:",
          "Recover a prompt from hidden states, with and without defences, and see why sequence "
          "sharding (Cascade) resists it.",
          "Hidden No More / Cascade (ICML 2025)", ("causal_lm", "vlm")),
    Panel("saved_analyses.py", "Saved analyses", ":material/bookmarks:",
          "Analyses saved from any panel, reopened by permalink without recomputing.",
          "", ("causal_lm", "vlm")),
]
