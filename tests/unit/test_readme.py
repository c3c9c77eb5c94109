"""README.md is the landing page: what it must hold is checked by content (a line count only made people
join lines to get under it). The two commands, a screenshot and a docs page for every panel the app
navigates to, every preset, the support matrix's link, the Spaces front matter, and no history."""
from __future__ import annotations

import re

from analysis.framework import panels
from analysis.framework.paths import ROOT

README = (ROOT / "README.md").read_text()


def test_the_two_commands_and_ci_run_the_same_script():
    assert "bash scripts/run_app.sh" in README and "bash scripts/test.sh" in README
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_every_panel_has_a_row_a_docs_page_and_a_picture_that_exist():
    table = README.split("## Tour of the panels", 1)[1].split("\n## ", 1)[0]
    pictures = re.findall(r"!\[[^\]]*\]\((docs/screenshots/[^)]+)\)", table)
    assert pictures and all((ROOT / p).is_file() for p in pictures), pictures
    for analysis in panels.analyses():
        row = next((line for line in table.splitlines() if line.startswith(f"| {analysis.title} |")), None)
        assert row, f"the panel table has no row for {analysis.title}"
        docs = re.findall(r"\((docs/[^)]+\.md)\)", row)
        assert docs and all((ROOT / d).is_file() for d in docs), row
        picture = f"docs/screenshots/{analysis.url_path}.png"
        assert picture in pictures, f"no screenshot of {analysis.title} ({picture}) in the tour"


def test_every_preset_is_listed_by_its_permalink_name():
    listed = README.split("### Presets", 1)[1].split("\n## ", 1)[0]
    for analysis in panels.analyses():
        for preset in analysis.presets:
            assert f"(`{preset.name}`" in listed, f"{analysis.title}: preset {preset.name} is not in the README"


def test_links_to_docs_resolve_and_the_support_matrix_is_linked():
    assert "docs/models.md#support-matrix" in README
    for target in re.findall(r"\]\(((?:docs|deploy|scripts)/[^)#]+)", README):
        assert (ROOT / target).exists(), target


def test_front_matter_names_the_container_port():
    front = README.split("---\n", 2)[1] if README.startswith("---\n") else ""
    assert "sdk: docker" in front and "app_port: 8501" in front
    assert "EXPOSE 8501" in (ROOT / "Dockerfile").read_text()


def test_no_history_on_the_landing_page():
    assert not re.search(r"changelog|history of the project|what changed in", README, re.I)


def test_every_shipped_talk_and_making_your_own_are_in_give_a_talk():
    from analysis import talks

    section = README.split("### Give a talk", 1)[1].split("\n## ", 1)[0]
    for talk in talks.all_talks():
        assert f"`{talk.name}`" in section, f"the talk {talk.name} is not in the README's 'Give a talk'"
    assert "**Make your own**" in section and "?talk=<its id>" in section
