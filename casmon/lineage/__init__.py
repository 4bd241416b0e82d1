"""Lineage: where a value came from and where it went, as joins over the hashes casmon already records.

Edges are recorded as calls happen, without annotation (:mod:`casmon.caching.edges`); this layer only reads
records (cache entries, code versions, clears, runs) and answers:

* :func:`lineage` -- the upstream graph of a run, a function, an entry: cached calls with code versions, files
  with digests, a run's params;
* :func:`used_by` -- the entries and runs that consumed a function (version), an entry, a file or a digest;
* :func:`stale` -- entries and runs whose upstream changed since, each with the reason;
* :func:`first_difference` -- where two runs' lineages part, with ``explain``'s wording and the source diff.

Each answers a :class:`Graph` (``to_json()``, ``to_dot()``; ``first_difference`` its own object). No second
store: a missing upstream (cleared, collected) is a node marked so, and gc keeps nothing alive for an edge.
Modules: ``index`` (one read of the records), ``columns`` and ``derived`` (every entry's lineage fields as
columns, kept in a derived index), ``joins`` (the joins over them, in bulk), ``graph`` (the answer's shape; a big
one's nodes made when read), ``queries``, ``difference``.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from casmon.lineage.difference import FirstDifference, Parting, first_difference
from casmon.lineage.graph import Edge, Graph, Node
from casmon.lineage.index import Index
from casmon.lineage.queries import Staleness, lineage, stale, used_by

__all__ = ["lineage", "used_by", "stale", "first_difference", "Graph", "Node", "Edge", "Index", "Staleness",
           "FirstDifference", "Parting"]


class _Callable(types.ModuleType):
    """``casmon.lineage(target)`` is :func:`lineage`: importing this package makes ``casmon.lineage`` the package
    (the import system sets it), so the package answers the call itself."""

    def __call__(self, target: Any, store: Any = None) -> Graph:
        return lineage(target, store)


sys.modules[__name__].__class__ = _Callable
