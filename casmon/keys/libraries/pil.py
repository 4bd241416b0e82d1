"""PIL: images by class, mode, size, pixels, palette and ``info`` (by key name)."""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

from casmon.keys.fingerprint import register_library_hasher

__all__: list[str] = []


def _image_key(im: Any) -> Any:
    pixels = np.frombuffer(im.tobytes(), np.uint8)  # loads a lazily opened file: its pixels are what count
    palette = im.getpalette() if im.mode in ("P", "PA") else None
    return (im.mode, tuple(im.size), palette, dict(sorted(im.info.items())), pixels)


register_library_hasher(Image.Image, _image_key)
