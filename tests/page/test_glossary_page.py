"""The glossary is one click from every page (a page of the navigation), and every panel page says its plain
sentence first with the researcher's note (its intro) folded below it (#48)."""
from __future__ import annotations

from analysis.model_access.models import ModelSpec
from components import glossary as G
from components import plain
from components.hosting import escape_markdown
from components.views.kv import KvView
from conftest import app_with_model


def test_the_glossary_page_lists_every_term():
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), page="views/glossary.py")
    assert not at.exception and at.title[0].value == "Glossary"
    text = " ".join(m.value for m in at.markdown)
    for t in G.TERMS:
        assert f"*{escape_markdown(t.name)}*" in text, t.symbol


def test_a_panel_page_says_its_plain_sentence_first_and_folds_the_note():
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), page="views/kv_cache.py")
    assert not at.exception
    assert at.markdown[0].value == f"**{plain.sentence('kv')}**"
    note = next(e for e in at.expander if e.label == "The researcher's note")
    assert any(KvView.intro[:40] in m.value for m in note.markdown)
