"""A 2,000-digit integer in any URL field (#50): refused with that field's own message, never the generic
error box (`int too large to convert to float` escaped validation before)."""
from __future__ import annotations

import pytest

from analysis.framework import panels
from analysis.framework.errors import SettingsError
from analysis.framework.settings import check_value, kind_of, parse_text
from analysis.model_access.models import ModelSpec, zoo_models
from components.view import url_fields
from conftest import app_with_model

GIANT = "9" * 2000


def _number_fields():
    for analysis in panels.analyses():
        for name, f in url_fields(analysis).items():
            kind = kind_of(f, analysis.params)
            item = f.metadata.get("item") if kind is list else kind
            if item is int and f.metadata.get("choices") is None:  # a float of 2,000 digits is inf: the default
                yield f"{analysis.name}:{name}", f, kind


FIELDS = list(_number_fields())


def test_there_are_number_fields_to_check():
    assert len(FIELDS) >= 15


@pytest.mark.parametrize("sign", ["", "-"])
def test_every_number_field_refuses_a_giant_integer_with_its_own_message(sign):
    wrong = []
    for name, f, kind in FIELDS:
        value = parse_text(f, sign + GIANT)
        try:
            check_value(f, value, kind)
            wrong.append(f"{name}: accepted")
        except SettingsError as exc:
            if f.metadata["label"] not in str(exc) or "2,000 digits" not in str(exc):
                wrong.append(f"{name}: {exc}")
        except Exception as exc:  # noqa: BLE001  (what escaped validation is the finding)
            wrong.append(f"{name}: {type(exc).__name__}: {exc}")
    assert wrong == []


PAGES = {"views/kv_cache.py": "budget", "views/residual_stream.py": "top_k",
         "views/attention_sharpness.py": "samples", "views/prompt_reconstruction.py": "layer"}


@pytest.mark.skipif("shapes-lm" not in zoo_models(), reason="needs the demo zoo")
@pytest.mark.parametrize("page", list(PAGES))
def test_a_giant_integer_in_a_link_is_the_fields_message_on_the_page(page):
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), page, query={PAGES[page]: GIANT}, timeout=300)
    assert not at.exception, [e.value for e in at.exception]
    assert any("2,000 digits" in e.value for e in at.error), [e.value for e in at.error]
