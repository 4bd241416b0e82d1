"""The cache entries' lineage fields as columns: what ``used_by`` and ``stale`` join, checked and joined in bulk.

One row per entry (the newest record of its key), rows sorted by key. Keys and digests are 16-byte columns
(numpy ``S16``: sortable, so a join is a ``searchsorted``); names, versions, labels and paths index one string
table; an entry's parameters (``pc``: content digests, ``up``: upstream keys by identity, ``files``) are CSR
arrays (``*_ptr[i]:*_ptr[i+1]`` are row ``i``'s items). Only well-formed values enter a column: a digest that is
not 32 lowercase hex digits matches nothing, as the record readers say (:mod:`casmon.caching.entries`), and is
left out. ``a`` (the parameters' digests, which ``diff`` compares) is kept too: names in the string table,
values in a list of their own (nearly every one differs: a table of them would cost every query a lookup dict).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

__all__ = ["Columns", "ranges", "spans", "hexes"]

_HEX = re.compile(r"[0-9a-f]{32}")
_NONE = -1
#: column name -> dtype (every per-row column; the CSR item columns are in :data:`ITEMS`)
ROWS = {"key": "S16", "fn": "<i4", "v": "<i4", "time": "<f8", "expires": "<f8", "result": "S16", "rf": "S16",
        "has": "u1", "label": "<i4", "pc_ptr": "<i8", "up_ptr": "<i8", "f_ptr": "<i8", "a_ptr": "<i8"}
ITEMS = {"pc_name": "<i4", "pc_d": "S16", "up_name": "<i4", "up_key": "S16", "f_param": "<i4", "f_path": "<i4",
         "f_d": "<i4", "a_name": "<i4", "a_val": "<i4"}
HAS_RESULT, HAS_RF = 1, 2
_FMAX = 1e18


def _digest(x: Any) -> bytes | None:
    return bytes.fromhex(x) if type(x) is str and _HEX.fullmatch(x) else None


def hexes(col: np.ndarray) -> list[str]:
    """The hex of each 16-byte value of ``col``, in one pass."""
    h = np.ascontiguousarray(col).tobytes().hex()
    return [h[i:i + 32] for i in range(0, len(h), 32)]


def spans(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``starts[i]:ends[i]`` for each ``i``, concatenated, as one index array."""
    lens = ends - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    # each item's index: its span's start, plus its place in the span
    offs = np.repeat(starts - np.concatenate(([0], np.cumsum(lens)[:-1])), lens)
    return offs + np.arange(total, dtype=np.int64)


def ranges(ptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The item indices of ``rows`` in a CSR array: ``ptr[r]:ptr[r+1]`` for each row, concatenated."""
    return spans(ptr[rows], ptr[rows + 1])


class Columns:
    """The columns (attributes named as in :data:`ROWS` and :data:`ITEMS`), the string table and ``a``."""

    def __init__(self, cols: dict[str, np.ndarray], strings: list[str], avals: list[str] | None = None) -> None:
        for name, arr in cols.items():
            setattr(self, name, arr)
        self.key: np.ndarray
        self.fn: np.ndarray
        self.v: np.ndarray
        self.time: np.ndarray
        self.expires: np.ndarray
        self.result: np.ndarray
        self.rf: np.ndarray
        self.has: np.ndarray
        self.label: np.ndarray
        self.pc_ptr: np.ndarray
        self.pc_name: np.ndarray
        self.pc_d: np.ndarray
        self.up_ptr: np.ndarray
        self.up_name: np.ndarray
        self.up_key: np.ndarray
        self.f_ptr: np.ndarray
        self.f_param: np.ndarray
        self.f_path: np.ndarray
        self.f_d: np.ndarray
        self.a_ptr: np.ndarray
        self.a_name: np.ndarray
        self.a_val: np.ndarray
        self.strings = strings
        self.avals: list[str] = avals if avals is not None else []
        self.n = len(self.key)
        self._sid: dict[str, int] | None = None
        self._cache: dict[str, Any] = {}

    # -- making ------------------------------------------------------------------------------------------------
    @classmethod
    def from_records(cls, entries: dict[str, dict[str, Any]]) -> Columns:
        """The columns of records (key hex -> the newest record, as the record readers answer them)."""
        strings: dict[str, int] = {}

        def s(x: Any) -> int:
            if type(x) is not str:
                return _NONE
            i = strings.get(x)
            if i is None:
                i = strings[x] = len(strings)
            return i

        keys = sorted(k for k in entries if _HEX.fullmatch(k))
        n = len(keys)
        key = np.frombuffer(bytes.fromhex("".join(keys)), "S16") if n else np.zeros(0, "S16")
        fn = np.empty(n, "<i4")
        v = np.empty(n, "<i4")
        tm = np.empty(n, "<f8")
        ex = np.full(n, np.nan, "<f8")
        result, rf = bytearray(16 * n), bytearray(16 * n)
        has = np.zeros(n, "u1")
        label = np.empty(n, "<i4")
        ptr = {p: np.zeros(n + 1, "<i8") for p in ("pc", "up", "f", "a")}
        avals: list[str] = []
        items: dict[str, list[Any]] = {c: [] for c in ITEMS}
        for i, k in enumerate(keys):
            r = entries[k]
            fn[i] = s(str(r.get("fn", "?")))
            v[i] = s(r.get("v"))
            t = r.get("time", 0.0)
            tm[i] = t if (type(t) is int or type(t) is float) and 0 <= t <= _FMAX else 0.0
            e = r.get("expires")
            if (type(e) is int or type(e) is float) and 0 <= e <= _FMAX:
                ex[i] = e
            d = _digest(r.get("result"))
            if d is not None:
                result[16 * i:16 * i + 16] = d
                has[i] |= HAS_RESULT
            d = _digest(r.get("rf"))
            if d is not None:
                rf[16 * i:16 * i + 16] = d
                has[i] |= HAS_RF
            label[i] = s(r.get("label"))
            pc = r.get("pc")
            for name, x in (pc.items() if type(pc) is dict else ()):
                d = _digest(x)
                if d is not None:
                    items["pc_name"].append(s(str(name)))
                    items["pc_d"].append(d)
            up = r.get("up")
            for name, ks in (up.items() if type(up) is dict else ()):
                for x in ks if type(ks) is list else ():
                    d = _digest(x)
                    if d is not None:
                        items["up_name"].append(s(str(name)))
                        items["up_key"].append(d)
            files = r.get("files")
            for f in files if type(files) is list else ():
                if type(f) is list and len(f) >= 3 and all(type(x) is str for x in f[:3]):
                    items["f_param"].append(s(f[0]))
                    items["f_path"].append(s(f[1]))
                    items["f_d"].append(s(f[2]))
            ptr["pc"][i + 1] = len(items["pc_name"])
            ptr["up"][i + 1] = len(items["up_name"])
            ptr["f"][i + 1] = len(items["f_param"])
            aa = r.get("a")
            for name, x in (aa.items() if type(aa) is dict else ()):
                if type(x) is str:
                    items["a_name"].append(s(str(name)))
                    items["a_val"].append(len(avals))
                    avals.append(x)
            ptr["a"][i + 1] = len(items["a_name"])
        cols: dict[str, np.ndarray] = {
            "key": key, "fn": fn, "v": v, "time": tm, "expires": ex, "has": has, "label": label,
            "result": np.frombuffer(bytes(result), "S16") if n else np.zeros(0, "S16"),
            "rf": np.frombuffer(bytes(rf), "S16") if n else np.zeros(0, "S16"),
            "pc_ptr": ptr["pc"], "up_ptr": ptr["up"], "f_ptr": ptr["f"], "a_ptr": ptr["a"]}
        for c, dt in ITEMS.items():
            cols[c] = (np.frombuffer(b"".join(items[c]), "S16") if items[c] else np.zeros(0, "S16")) \
                if dt == "S16" else np.asarray(items[c], dt)
        return cls(cols, list(strings), avals)

    def merged(self, newer: Columns) -> Columns:
        """These rows and ``newer``'s, one per key: the newest record (equal times: ``newer``'s)."""
        if newer.n == 0:
            return self
        table = {x: i for i, x in enumerate(self.strings)}
        strings = list(self.strings)
        remap = np.empty(len(newer.strings) + 1, "<i4")
        remap[-1] = _NONE  # index -1 stays "none"
        for i, x in enumerate(newer.strings):
            j = table.get(x)
            if j is None:
                j = table[x] = len(strings)
                strings.append(x)
            remap[i] = j
        both = self.n + newer.n
        key = np.concatenate((self.key, newer.key))
        tm = np.concatenate((self.time, newer.time))
        # the last row of each key in (key, time, newer-last) order is the one kept
        order = np.lexsort((np.arange(both), tm, key))
        ks = key[order]
        last = np.ones(both, bool)
        last[:-1] = ks[1:] != ks[:-1]
        keep = order[last]
        cols: dict[str, np.ndarray] = {}
        for c in ROWS:
            if c.endswith("_ptr"):
                continue
            b = getattr(newer, c)
            if c in ("fn", "v", "label"):
                b = remap[b]
            cols[c] = np.concatenate((getattr(self, c), b))[keep]
        for p, names in (("pc", ("pc_name", "pc_d")), ("up", ("up_name", "up_key")),
                         ("f", ("f_param", "f_path", "f_d")), ("a", ("a_name", "a_val"))):
            aptr, bptr = getattr(self, p + "_ptr"), getattr(newer, p + "_ptr")
            ptr = np.concatenate((aptr[:-1], bptr + aptr[-1]))
            lens = np.diff(np.concatenate((ptr, [aptr[-1] + bptr[-1]])))[keep]
            idx = ranges(np.concatenate((ptr, [aptr[-1] + bptr[-1]])), keep)
            cols[p + "_ptr"] = np.concatenate(([0], np.cumsum(lens))).astype("<i8")
            for c in names:
                b = getattr(newer, c)
                if c == "a_val":
                    b = b + len(self.avals)
                elif ITEMS[c] == "<i4":
                    b = remap[b]
                cols[c] = np.concatenate((getattr(self, c), b))[idx]
        return Columns(cols, strings, self.avals + newer.avals)

    # -- reading -----------------------------------------------------------------------------------------------
    def sid(self, s: str) -> int:
        """The index of string ``s`` in the table; -2 where it is not there (it matches no row)."""
        if self._sid is None:
            self._sid = {x: i for i, x in enumerate(self.strings)}
        return self._sid.get(s, -2)

    def rows_of(self, keys: np.ndarray) -> np.ndarray:
        """The row of each 16-byte key; -1 where it is no row."""
        lo, hi = self.find("key", keys)
        return np.where(lo < hi, lo, -1)

    def _sorted(self, name: str) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, bool]:
        """``(rows sorted by column name, None where they are every row in order; the sorted values; their
        leading 8 bytes as integers; whether two different values share those)``."""
        got = self._cache.get("sorted " + name)
        if got is None:
            if name == "key":
                order, vals = None, self.key
            else:
                order, vals = self.sorted_rf()
            lead = _lead(vals)
            same = lead[1:] == lead[:-1]
            clash = bool(np.any(vals[1:][same] != vals[:-1][same])) if len(vals) > 1 else False
            got = self._cache["sorted " + name] = (order, vals, lead, clash)
        return got

    def find(self, name: str, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each 16-byte query, ``lo:hi``, the positions in the sorted column ``name`` (``key`` or ``rf``)
        holding that value (``lo == hi``: none). Searched by the leading 8 bytes as integers (a string search
        of 16-byte values costs ten times more), then checked whole."""
        _order, vals, lead, clash = self._sorted(name)
        if clash or not len(vals):  # two values share their leading bytes (crafted, or 2**-64): the slow way
            return np.searchsorted(vals, queries, "left"), np.searchsorted(vals, queries, "right")
        q = _lead(queries)
        if len(q) > 4096:  # searched in order: each search starts near the last (four times faster at 1M)
            o = np.argsort(q)
            lo, hi = np.empty(len(q), np.int64), np.empty(len(q), np.int64)
            lo[o] = np.searchsorted(lead, q[o], "left")
            hi[o] = np.searchsorted(lead, q[o], "right")
        else:
            lo = np.searchsorted(lead, q, "left")
            hi = np.searchsorted(lead, q, "right")
        ok = lo < hi
        ok[ok] = vals[lo[ok]] == queries[ok]
        return lo, np.where(ok, hi, lo)

    def row(self, key_hex: str) -> int:
        d = _digest(key_hex)
        if d is None or self.n == 0:
            return -1
        return int(self.rows_of(np.array([d], "S16"))[0])

    def record(self, i: int) -> dict[str, Any]:
        """Row ``i`` as the record readers answer its lineage fields."""
        st = self.strings
        r: dict[str, Any] = {"fn": st[self.fn[i]], "time": float(self.time[i])}
        if self.v[i] >= 0:
            r["v"] = st[self.v[i]]
        if not np.isnan(self.expires[i]):
            r["expires"] = float(self.expires[i])
        if self.has[i] & HAS_RESULT:
            r["result"] = bytes(self.result[i:i + 1].tobytes()).hex()
        if self.has[i] & HAS_RF:
            r["rf"] = bytes(self.rf[i:i + 1].tobytes()).hex()
        if self.label[i] >= 0:
            r["label"] = st[self.label[i]]
        a, b = int(self.pc_ptr[i]), int(self.pc_ptr[i + 1])
        if b > a:
            r["pc"] = dict(zip((st[j] for j in self.pc_name[a:b]), hexes(self.pc_d[a:b])))
        a, b = int(self.up_ptr[i]), int(self.up_ptr[i + 1])
        if b > a:
            up: dict[str, list[str]] = {}
            for name, k in zip((st[j] for j in self.up_name[a:b]), hexes(self.up_key[a:b])):
                up.setdefault(name, []).append(k)
            r["up"] = up
        a, b = int(self.f_ptr[i]), int(self.f_ptr[i + 1])
        if b > a:
            r["files"] = [[st[p], st[q], st[d]] for p, q, d in
                          zip(self.f_param[a:b].tolist(), self.f_path[a:b].tolist(), self.f_d[a:b].tolist())]
        a, b = int(self.a_ptr[i]), int(self.a_ptr[i + 1])
        if b > a:
            r["a"] = {st[p]: self.avals[q] for p, q in zip(self.a_name[a:b].tolist(), self.a_val[a:b].tolist())}
        return r

    def records(self) -> dict[str, dict[str, Any]]:
        return dict(zip(hexes(self.key), (self.record(i) for i in range(self.n))))

    def sorted_rf(self) -> tuple[np.ndarray, np.ndarray]:
        """``(rows with a result fingerprint, sorted by it; their fingerprints)``: an ``rf`` join's one sort."""
        got = self._cache.get("rf")
        if got is None:
            rows = np.flatnonzero(self.has & HAS_RF)
            vals = self.rf[rows]
            lead = _lead(vals)
            o = np.argsort(lead, kind="stable")  # by the leading bytes as integers: a string sort costs more
            same = lead[o][1:] == lead[o][:-1]
            if len(o) > 1 and bool(np.any(vals[o][1:][same] != vals[o][:-1][same])):
                o = np.argsort(vals, kind="stable")  # two fingerprints share those bytes: sorted whole
            rows = rows[o]
            got = self._cache["rf"] = (rows, self.rf[rows])
        return got

    def with_rf(self, digests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each of ``digests``, the rows whose ``rf`` equals it: ``(index into digests, row)`` pairs."""
        rows, _rfs = self.sorted_rf()
        lo, hi = self.find("rf", digests)
        return np.repeat(np.arange(len(digests)), hi - lo), rows[spans(lo, hi)]


def _lead(col: np.ndarray) -> np.ndarray:
    """The leading 8 bytes of each 16-byte value, as integers ordered as the values are."""
    if not len(col):
        return np.zeros(0, np.uint64)
    return np.ascontiguousarray(col).view(">u8")[::2].astype(np.uint64)
