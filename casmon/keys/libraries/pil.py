"""PIL: images by class, mode, size, pixels, palette (with its mode: RGB or RGBA) and ``info`` (by key name)."""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

from casmon.keys.fingerprint import register_library_hasher

__all__: list[str] = []


def _image_key(im: Any) -> Any:
    pixels = np.frombuffer(im.tobytes(), np.uint8)  # loads a lazily opened file: its pixels are what count
    palette = None
    if im.mode in ("P", "PA") and im.palette is not None:
        palette = (im.palette.mode, im.getpalette(rawmode=im.palette.mode))
    info = sorted(im.info.items(), key=lambda kv: (type(kv[0]).__name__, str(kv[0])))
    return (im.mode, tuple(im.size), palette, info, pixels)


register_library_hasher(Image.Image, _image_key)
