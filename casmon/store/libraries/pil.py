"""PIL: images (``PIL.Image.Image`` exactly) as mode, size, palette, ``info`` and one buffer of pixels.

Images opened from files (``PngImageFile``, ...) are pickled as PIL pickles them, so
they keep their class; so are images whose ``info`` is not plain JSON.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from PIL import Image

from casmon.store.serialize import Part

__all__ = ["ImageHandler"]


class ImageHandler:
    name = "PIL.Image"
    safe = True  # pixels from bytes, a mode and size checked by PIL

    def encode(self, im: Any) -> tuple[dict[str, Any], list[Any]] | None:
        info = dict(im.info)
        try:
            if json.loads(json.dumps(info)) != info:
                return None
        except (TypeError, ValueError):
            return None
        pixels = np.frombuffer(im.tobytes(), np.uint8)
        palette = rawmode = None
        if im.mode in ("P", "PA") and im.palette is not None:
            rawmode = im.palette.mode
            palette = im.getpalette(rawmode=rawmode)
        meta = {"mode": im.mode, "size": list(im.size), "palette": palette, "palette_mode": rawmode, "info": info}
        return meta, [Part(pixels.data, row_bytes=max(1, pixels.nbytes // max(1, im.size[1])), numeric=True)]

    def decode(self, meta: dict[str, Any], buffers: list[np.ndarray[Any, np.dtype[np.uint8]]]) -> Any:
        width, height = (int(n) for n in meta["size"])
        im = Image.frombytes(str(meta["mode"]), (width, height), buffers[0].tobytes())
        if meta.get("palette") is not None:
            im.putpalette([int(x) for x in meta["palette"]], rawmode=str(meta.get("palette_mode") or "RGB"))
        im.info.update(meta.get("info") or {})
        return im


HANDLER = ImageHandler()


def handles(t: type) -> bool:
    """Whether :data:`HANDLER` saves values of exactly type ``t``."""
    return t is Image.Image
