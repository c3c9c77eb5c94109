"""Everything a visitor supplies is shown as text (#50): own prompts, captions and file names inside uploaded
data, an outside SAE's metadata. Each case renders a view with text carrying a Markdown link, a remote image
and HTML, and checks no element of the page would render them (hosting.escape_markdown is the one path)."""
from __future__ import annotations

import io
import json
import zipfile

import pytest
from PIL import Image

from analysis.model_access.models import ModelSpec, zoo_models
from conftest import app_with_model
from sae_lens_factory import cache, save_outside_sae  # noqa: F401  (a fixture)

EVIL = "[click](https://evil.example/a) ![x](https://evil.example/i.png) <b>bold</b> **big**"
MARKDOWN_KINDS = ("caption", "markdown", "info", "warning", "error", "success", "title", "header", "subheader")


def rendered_markup(at) -> list[str]:
    """Markdown bodies of the page that still hold the attacker's link or image (a word joiner after
    'https:' and backslashes before brackets make them text)."""
    out = []
    for kind in MARKDOWN_KINDS:
        for element in getattr(at, kind):
            value = str(element.value)
            if "https://evil" in value or "](" in value or "<b>" in value:
                out.append(f"{kind}: {value}")
    for metric in at.metric:
        if "https://evil" in str(metric.label):
            out.append(f"metric label: {metric.label}")
    return out


@pytest.mark.skipif("shapes-lm" not in zoo_models(), reason="needs the demo zoo")
def test_own_prompts_in_the_patching_caption_are_text():
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), "views/residual_stream.py",
                        query={"view": "patching", "pair": "own", "prompt": "the red square " + EVIL,
                               "corrupt": "the blue square " + EVIL, "components": "residual",
                               "methods": "attribution"})
    assert not at.exception, [e.value for e in at.exception]
    assert any("Clean:" in c.value and "evil" in c.value for c in at.caption)  # the prompts are shown...
    assert rendered_markup(at) == []  # ...as text


def _evil_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        lines = []
        for i in range(8):
            image = io.BytesIO()
            Image.new("RGB", (32, 32), (30 * i, 200 - 20 * i, 90)).save(image, format="PNG")
            archive.writestr(f"img{i}.png", image.getvalue())
            lines.append({"image": f"img{i}.png", "caption": f"w{i} w{i + 1} {EVIL}"})
        lines.append({"image": "img0.png", "caption": f"another caption {EVIL}"})  # a note quotes the file name
        archive.writestr("captions.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    return buffer.getvalue()


def test_uploaded_captions_and_an_outside_sae_in_the_ranking_are_text(tiny_llava_dir, cache, model_root):  # noqa: F811
    from analysis.sae_v import userdata

    outside = save_outside_sae(model_root / "visitor-text-sae", d_in=32, hook="blocks.1.hook_resid_post")
    locator = userdata.save_zip(_evil_zip(), owner="ip:attacker")
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), "views/sae_features.py",
                        query={"sae": str(outside), "data": locator, "view": "ranking", "thr": "0"}, timeout=300)
    assert not at.exception, [e.value for e in at.exception]
    assert any("evil" in c.value for c in at.caption)  # the extremes quote the captions
    assert rendered_markup(at) == []


def _text_fields(page: str) -> list[str]:
    """The URL names of a page's free-text fields (prompts, captions, tokens), read when the test runs."""
    from analysis.framework import panels
    from analysis.framework.settings import kind_of
    from components.view import params_fields, state_fields
    from analysis.framework.settings import url_name

    for analysis in panels.analyses():
        if analysis.page and page == f"views/{analysis.page}":
            return sorted(url_name(f) for f, owner in params_fields(analysis) + state_fields(analysis)
                          if url_name(f) and kind_of(f, owner) is str and f.metadata.get("choices") is None)
    return []


TEXT_PAGES = {"views/kv_cache.py": "shapes-lm", "views/prompt_reconstruction.py": "shapes-lm",
              "views/attention_sharpness.py": "shapes-lm", "views/residual_stream.py": "shapes-lm",
              "views/caption_correction.py": "shapes-vlm"}


@pytest.mark.skipif(not {"shapes-lm", "shapes-vlm"} <= set(zoo_models()), reason="needs the demo zoo")
@pytest.mark.parametrize("page", list(TEXT_PAGES))
def test_every_text_field_of_a_view_is_shown_as_text(page):
    """Each free-text field of the page carries the attacker's Markdown and HTML (words of the demo vocabulary
    around it, so the analysis runs); nothing the page draws renders it."""
    names = [n for n in _text_fields(page) if n not in ("model", "other_model", "sae", "data")]
    assert names, page
    query = {name: "the red square " + EVIL for name in names}
    if page.endswith("caption_correction.py"):
        query |= {"cap": "paste", "ground": "0"}
    at = app_with_model(ModelSpec("zoo", TEXT_PAGES[page]), page, query=query, timeout=300)
    assert not at.exception, [e.value for e in at.exception]
    assert rendered_markup(at) == []
    for element in at.get("html"):
        assert "<b>bold</b>" not in element.proto.body and "https://evil" not in element.proto.body
