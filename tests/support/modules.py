"""casmon's modules imported one by one, as the layering and key-name tests walk them."""

from __future__ import annotations

import importlib
from types import ModuleType


def import_if_installed(name: str) -> ModuleType | None:
    """Import casmon's module ``name``; None for a ``libraries`` module whose ML library is not installed
    here (torch on Python 3.12+). Any other failure to import is raised."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if ".libraries." in name and e.name and not e.name.startswith("casmon"):
            return None
        raise
