"""The QR code on a talk's first and last step holds the talk's read-only link: read back with tests/qr_reader.py
(written from ISO/IEC 18004, independent of segno, which draws the code). A short link made a Micro QR code,
which phone cameras do not read: the talk draws a full QR code whatever the link's length."""
from __future__ import annotations

import io

import pytest
import segno

from components.talk_screen import qr_png
from qr_reader import read_qr

LINKS = ["/?talk=abc", "/?talk=kv-cache", "http://localhost:8501/?talk=sae-features",
         "https://inspector.example.org/?talk=Ab3_x-Y9kQw",
         "https://a-much-longer-host-name.example.org:8501/inspector/?talk=six-findings"]


@pytest.mark.parametrize("error", "lmqh")
@pytest.mark.parametrize("text", LINKS + ["HELLO WORLD 123", "0123456789012"])
def test_the_reader_reads_codes_of_every_level_and_mode(text, error):
    buf = io.BytesIO()
    segno.make_qr(text, error=error, boost_error=False).save(buf, kind="png", scale=3, border=4)
    assert read_qr(buf.getvalue()) == text


def _png(matrix) -> bytes:
    from PIL import Image

    size = len(matrix) + 8
    image = Image.new("L", (size * 3, size * 3), 255)
    for r, row in enumerate(matrix):
        for c, dark in enumerate(row):
            if dark:
                image.paste(0, ((c + 4) * 3, (r + 4) * 3, (c + 5) * 3, (r + 5) * 3))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def test_the_reader_reads_the_modules_not_a_guess():
    """Drawn module by module here, the code reads back; with its first data codeword's modules inverted (the
    bottom-right corner: the segment's mode and length) it no longer reads as the link (nothing is corrected)."""
    link = "http://localhost:8501/?talk=sae-features"
    matrix = [list(row) for row in segno.make_qr(link, error="m").matrix]
    assert read_qr(_png(matrix)) == link
    n = len(matrix)
    for r, c in ((n - 1, n - 1), (n - 1, n - 2), (n - 2, n - 1), (n - 2, n - 2)):
        matrix[r][c] ^= 1
    try:
        got = read_qr(_png(matrix))
    except (AssertionError, UnicodeDecodeError, IndexError, ValueError):  # no longer a readable segment
        got = None
    assert got != link


@pytest.mark.parametrize("link", LINKS)
def test_the_talks_qr_code_holds_its_link(link):
    assert read_qr(qr_png(link)) == link
