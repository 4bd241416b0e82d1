"""Where a run runs: the notebook, the user, the installed packages."""

from __future__ import annotations

import functools
import getpass
import os
import sys

from casmon.scrub import scrub as _scrub

__all__ = ["notebook_path", "user", "packages"]


def scrub(text: str) -> str:
    return _scrub(text, whole=True)


def notebook_path() -> str | None:
    """The notebook this process runs, if it is a Jupyter kernel whose front end says which; else None.

    Sources, first found wins: ``__vsc_ipynb_file__`` in the kernel's namespace (VS Code
    sets it to the notebook's absolute path); the ``JPY_SESSION_NAME`` environment variable
    (Jupyter Server 2 sets it when it starts a kernel for a notebook: JupyterLab, Notebook 7;
    the path is relative to the server's root folder in some versions); ``__session__`` in
    the kernel's namespace (ipykernel copies ``JPY_SESSION_NAME`` there). Only inside a
    kernel: a script started from a notebook (``!python x.py``) inherits the variable but is
    not the notebook. Kernels started without a server (nbclient, nbconvert, papermill) know
    no path unless their caller sets ``JPY_SESSION_NAME``.
    """
    if "ipykernel" not in sys.modules or "IPython" not in sys.modules:
        return None
    try:
        shell = sys.modules["IPython"].get_ipython()
        ns = getattr(shell, "user_ns", None) if shell is not None and hasattr(shell, "kernel") else None
    except Exception:  # noqa: BLE001 - an odd shell: no notebook
        return None
    if not isinstance(ns, dict):
        return None
    for v in (ns.get("__vsc_ipynb_file__"), os.environ.get("JPY_SESSION_NAME"), ns.get("__session__")):
        if isinstance(v, str) and v.strip():
            return scrub(v.strip())[:4096]
    return None


def user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001
        return str(os.getuid()) if hasattr(os, "getuid") else "?"


@functools.lru_cache(maxsize=1)
def packages() -> dict[str, str]:
    out = {}
    import importlib.metadata  # here, not at import: it costs tens of ms and only a run needs it

    for dist in importlib.metadata.distributions():
        try:
            out[dist.metadata["Name"]] = dist.version
        except Exception:  # noqa: BLE001
            continue
    return dict(sorted(out.items(), key=lambda kv: (kv[0] or "").lower()))
