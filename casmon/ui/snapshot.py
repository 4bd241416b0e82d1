"""The store as the cache pages read it: each kind's records decoded once for as long as its table is unchanged.

A cache page reads every entry of the cache table (per-function totals, the
live entries of one function, the nearest entries of one): at 100,000 entries
that is 100,000 JSON records decoded three times a request, seconds a page.
:class:`Snapshot` stands in for the store there: ``records(kind)`` lists the
table (so a page is as fresh as before), and decodes its entries only when
the files it reads changed since the last request (:meth:`Table.contents_key`;
table files are written once); ``kept(name, kinds, compute)`` does the same for
what a page computes from them. Everything else is the store's own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any, TypeVar, cast

from casmon.keys.digest import Digest
from casmon.store.records import parse_record

__all__ = ["Snapshot"]

T = TypeVar("T")


class Snapshot:
    """``store`` with ``records(kind)`` kept decoded per table contents (shared: the records are not to be changed)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._kept: dict[tuple[str, bool], tuple[Any, list[tuple[Digest, dict[str, Any]]]]] = {}
        self._results: dict[Hashable, tuple[Any, Any]] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def state(self, kind: str) -> Any:
        """The contents of ``kind``'s table as listed now: the files it reads (:meth:`Table.contents_key`) and
        those it found damaged, which a strict read refuses however unchanged the rest is."""
        t = self._store.table(kind)
        t.refresh()
        return t.contents_key(), frozenset(t.damaged)

    def kept(self, name: Hashable, kinds: Iterable[str], compute: Callable[[], T], every: float = 5.0) -> T:
        """``compute()``, again only when a table of ``kinds`` changed or ``every`` seconds passed (what depends on
        the clock, as an entry's expiry, is at most that late)."""
        key = (tuple(self.state(k) for k in kinds), int(time.time() // every))
        with self._lock:
            got = self._results.get(name)
        if got is not None and got[0] == key:
            return cast(T, got[1])
        value = compute()
        with self._lock:
            self._results[name] = (key, value)
            while len(self._results) > 64:
                del self._results[next(iter(self._results))]
        return value

    def records(self, kind: str, strict: bool = True) -> Iterator[tuple[Digest, dict[str, Any]]]:
        t = self._store.table(kind)
        key = self.state(kind)
        with self._lock:
            kept = self._kept.get((kind, strict))
        if kept is None or kept[0] != key:
            recs = [(Digest(k), parse_record(kind, k, v)) for k, v in t.items(refresh=False, strict=strict)]
            kept = (key, recs)
            with self._lock:
                self._kept[(kind, strict)] = kept
        return iter(kept[1])
