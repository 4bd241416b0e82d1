"""casmon's public types keep the module names they had before casmon's modules became packages.

A value's pickle names the module of every class in it, and a stored value is
named by the digest of its bytes: were ``casmon.Digest`` pickled as
``casmon.keys.digest.Digest``, a value holding one would get another digest than
the same value stored before (stored twice in one store), and a casmon of the
flat layout sharing the store could not load it. So each public type says it
lives where it lived (``Digest.__module__ == "casmon.digest"``), and a name that
is no longer a module (``casmon.digest``, ``casmon.cache``, ...) is a small
namespace in ``sys.modules`` holding just those types, which pickle looks them up
in. Messages and reprs that name a type (``CacheWarning``'s "cannot be hashed")
read as they did, and keys count them as before.

The flat names come from :func:`casmon.keys.fingerprint.casmon_key_module`, the
one table of where casmon's code was. Pickles that name other classes of the old
layout still load through :data:`casmon.store.serialize.MOVED_MODULES`.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable

from casmon.keys.fingerprint import casmon_key_module, key_class_module

__all__ = ["keep_flat_names"]


def keep_flat_names(kinds: Iterable[type]) -> None:
    """Give each of ``kinds`` the module name it had in the flat layout, importable by pickle."""
    for t in kinds:
        old = key_class_module(casmon_key_module(t.__module__), t.__qualname__)
        if old == t.__module__:
            continue
        home = sys.modules.get(old)
        if home is None:
            home = types.ModuleType(old, f"Where casmon's {old.rpartition('.')[2]} types were: kept for their pickles.")
            sys.modules[old] = home
            _made.add(old)
        if getattr(home, t.__qualname__, None) is not t:
            if old not in _made:  # a real module now (casmon.store): it must export the type itself
                raise RuntimeError(f"{old} does not export {t.__qualname__}: pickles naming it would not load")
            setattr(home, t.__qualname__, t)
        t.__module__ = old


#: The namespaces made here (the others are casmon's own packages).
_made: set[str] = set()
