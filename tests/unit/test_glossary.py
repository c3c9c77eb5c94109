"""Two levels of words (#48): every symbol the pages show is in the glossary, and no plain sentence (a page's,
a talk step's narration and summary) uses one."""
from __future__ import annotations

import ast

from analysis import talks
from analysis.framework import panels
from analysis.framework.paths import ROOT
from components import glossary as G
from components import plain

# Where the text a page shows is written: the views, their figures and sub-views, the shared page parts, the
# presets' findings. The glossary itself defines symbols with symbols.
SOURCES = [p for p in sorted((ROOT / "components").rglob("*.py")) if p.name != "glossary.py"] + \
          sorted((ROOT / "analysis").glob("*/presets.py"))


def shown_strings(path) -> list[str]:
    """The string constants of a module other than docstrings (a docstring is for the reader of the code)."""
    tree = ast.parse(path.read_text())
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


def test_every_symbol_a_page_shows_is_in_the_glossary():
    missing = {(path.relative_to(ROOT).as_posix(), s) for path in SOURCES for text in shown_strings(path)
               for s in G.missing(text)}
    assert not missing, f"symbols the glossary lacks: {sorted(missing)}"


def test_the_walk_finds_the_issues_symbols():
    seen = {s for path in SOURCES for text in shown_strings(path) for s in G.symbols_in(text)}
    assert {"δ", "θ", "ω", "s_i", "π", "KL", "ΔNLL", "CHAIR_i", "e^"} <= seen


def test_the_detector_reads_symbols_not_code_names():
    assert G.symbols_in("KL(full‖policy) and ΔNLL, s_i, CHAIR_i, e^(−δ/θ)/n") == \
        {"KL", "ΔNLL", "s_i", "CHAIR_i", "e^", "δ", "θ"}
    assert G.symbols_in("colorscale RdBu_r, key sae_q, chair_i column, the KLM airline") == set()


def test_each_glossary_entry_is_one_sentence_with_its_source_and_pages():
    pages = {a.url_path for a in panels.analyses()}
    for t in G.TERMS:
        assert t.meaning.endswith(".") and t.meaning.count(". ") == 0, t.symbol
        assert t.defined and set(t.pages) <= pages, t.symbol


def test_every_panel_has_a_plain_sentence_without_symbols():
    assert set(plain.PLAIN) == {a.name for a in panels.analyses()}
    for panel, sentence in plain.PLAIN.items():
        assert sentence.endswith(".") and G.symbols_in(sentence) == set(), (panel, G.symbols_in(sentence))


def test_talk_narrations_and_summaries_use_no_symbols():
    for t in talks.all_talks():
        for text in (t.summary, *(s.narration for s in t.steps), *(s.title for s in t.steps)):
            assert G.symbols_in(text) == set(), (t.name, text)
