"""Decoding an uploaded image safely: one decoder and one set of limits for every panel that takes uploads.

The size is read from the header before anything is decoded, and PIL's decompression-bomb guard is an
error, not a warning, so a small file that claims billions of pixels is refused without being expanded.
`MAX_IMAGE_BYTES` and `MAX_IMAGE_PIXELS` are the defaults; a deployment may lower them.
"""
from __future__ import annotations

import io
import warnings

from analysis.framework.errors import SettingsError

MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_IMAGE_PIXELS = 4096 * 4096


class ImageError(SettingsError):
    """An upload that is not an image we can read, or one above the limits; the message is for the user."""


def open_image(data: bytes, name: str = "The file", max_bytes: int | None = None, max_pixels: int | None = None):
    """The upload as an RGB PIL image, or ImageError with a message naming `name`."""
    from PIL import Image, UnidentifiedImageError

    max_bytes = MAX_IMAGE_BYTES if max_bytes is None else max_bytes
    max_pixels = MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    if len(data) > max_bytes:
        raise ImageError(f"{name} is {len(data) / 2**20:.1f} MB; images up to {max_bytes / 2**20:g} MB are accepted.")
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data))  # reads the header only
            width, height = image.size
            if width * height > max_pixels:
                raise ImageError(f"{name} is {width} x {height} pixels, above the limit of {max_pixels:,} pixels; "
                                 "it was not decoded (possible decompression bomb). Resize it and upload again.")
            image.load()
        except ImageError:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            # PIL refuses such headers itself, before we see the size.
            raise ImageError(f"{name} is far above the limit of {max_pixels:,} pixels; it was not decoded (possible "
                             f"decompression bomb: {exc}). Resize it and upload again.") from exc
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
            raise ImageError(f"{name} is not an image that can be read (PNG, JPEG, GIF, BMP or WebP "
                             "expected).") from exc
    return image.convert("RGB")
