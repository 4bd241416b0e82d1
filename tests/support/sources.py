"""Source files a test edits and imports again, correct with Python's bytecode cache on and off."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path


def write_module(path: str | Path, text: str) -> Path:
    """Write ``text`` to the module file ``path`` so that its next import, here or in a fresh process, runs it.

    Python reuses a ``.pyc`` whose recorded source mtime (whole seconds) and size match the file's, so an edit
    within the same second that keeps the size would run the old bytecode: the cached bytecode is removed.
    """
    path = Path(path)
    path.write_text(text)
    stale = {Path(importlib.util.cache_from_source(str(path)))}  # honours PYTHONPYCACHEPREFIX
    stale.update((path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"))  # other interpreters, -O levels
    for pyc in stale:
        pyc.unlink(missing_ok=True)
    importlib.invalidate_caches()
    return path
