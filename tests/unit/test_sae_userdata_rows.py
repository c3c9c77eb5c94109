"""Your data's rows as your editor numbers them (issue 40, item 4): blank lines counted and reported, a row
that repeats an earlier one (same caption, same image by content) reported as a duplicate and left out
with the first kept, an image shown with several captions kept and noted; exports pick the same lines."""
from __future__ import annotations

import json

import pytest
from PIL import Image

from analysis import sae_v


def _image(folder, name: str, colour) -> str:
    Image.new("RGB", (16, 16), colour).save(folder / name)
    return name


@pytest.fixture()
def folder(model_root, request):
    out = model_root / f"rows-{request.node.name}"
    out.mkdir(exist_ok=True)
    _image(out, "a.png", (200, 0, 0))
    _image(out, "b.png", (0, 200, 0))
    _image(out, "a-copy.png", (200, 0, 0))  # the same pixels as a.png under another name
    return out


def _jsonl(folder, lines: list) -> None:
    (folder / "captions.jsonl").write_text("".join((json.dumps(x) if x is not None else "") + "\n" for x in lines))


def test_rows_are_file_lines_blank_lines_reported_and_duplicates_left_out(folder):
    _jsonl(folder, [
        {"image": "a.png", "caption": "w1 w2"},  # line 1
        None,  # line 2: blank
        {"image": "b.png", "caption": "w3 w4"},  # line 3
        {"image": "a-copy.png", "caption": "w1 w2"},  # line 4: line 1 again (same pixels, same caption)
        {"image": "a.png", "caption": "w5 w6"},  # line 5: line 1's image, another caption: kept, noted
        {"image": "b.png", "caption": "w3 w4"},  # line 6: line 3 again
    ])
    data = sae_v.userdata.load(str(folder), "vlm")
    assert data.rows_read == 6
    assert [p.row + 1 for p in data.pairs.pairs] == [1, 3, 5]
    assert {s.row + 1: s.reason for s in data.skipped} == {
        2: "blank line", 4: "duplicate of row 1 (the same caption and image)",
        6: "duplicate of row 3 (the same caption and image)"}
    assert data.notes == ["Rows 5 show the same image as row 1 with other captions (kept: several captions per "
                          "image are normal)."]
    assert data.pairs.notes == data.notes


def test_csv_rows_are_the_lines_where_records_start(folder):
    with open(folder / "captions.csv", "w", newline="") as fh:
        fh.write("image,caption\n")  # line 1
        fh.write('a.png,"w1\nw2"\n')  # lines 2-3: one record over two lines
        fh.write("\n")  # line 4: blank
        fh.write("b.png,\n")  # line 5: no caption
        fh.write("b.png,w7\n")  # line 6
    data = sae_v.userdata.load(str(folder / "captions.csv"), "vlm")
    assert [p.row + 1 for p in data.pairs.pairs] == [2, 6]
    assert {s.row + 1: s.reason for s in data.skipped} == {4: "blank line", 5: "empty caption"}


def test_texts_number_lines_and_drop_repeated_texts(model_root):
    folder = model_root / "rows-texts"
    folder.mkdir(exist_ok=True)
    (folder / "texts.txt").write_text("w1 w2\n\nw3\nw1 w2\n")
    data = sae_v.userdata.load(str(folder), "causal_lm")
    assert [(p.row + 1, p.text) for p in data.pairs.pairs] == [(1, "w1 w2"), (3, "w3")]
    assert {s.row + 1: s.reason for s in data.skipped} == {2: "blank line", 4: "duplicate of row 1 (the same text)"}
