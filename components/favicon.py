"""The app's tab icon, drawn here so the browser fetches it from the app itself.

A Material-symbol page icon (":material/...:") makes Streamlit point the favicon at Google's font CDN:
every page load then asks fonts.gstatic.com for it, which fails (or waits on DNS) offline and tells a
third party who opened the app.
"""
from __future__ import annotations

from functools import lru_cache

from PIL import Image, ImageDraw

RED = (255, 75, 75, 255)  # Streamlit's default primary colour


@lru_cache(maxsize=1)
def favicon() -> Image.Image:
    """A 64-px magnifying glass over three bars (a look inside), transparent background."""
    img = Image.new("RGBA", (64, 64), (0, 0, 0, 0))
    draw = ImageDraw.Draw(img)
    draw.ellipse((4, 4, 44, 44), outline=RED, width=6)
    for x, top in ((15, 26), (22, 17), (29, 22)):
        draw.rectangle((x, top, x + 4, 34), fill=RED)
    draw.line((40, 40, 59, 59), fill=RED, width=9)
    return img
