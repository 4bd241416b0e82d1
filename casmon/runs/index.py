"""The runs index: derived data that lets ``list_runs`` read a few files instead of a ref and a manifest per run.

It lives under ``runs-index/``: a *base* file of entries and small *delta* files (one per ended run, written
at its end) that the next listing folds into a new base. An entry is ``[stamp, target, manifest, ref data]``
for one ended run: the stamp its ref file had when the entry was made (the backend's
:meth:`~casmon.store.backend.base.Backend.list_stamped`), the manifest digest the ref named, the manifest
itself (which holds the run's name and number, status, times, params, info, tags and per-metric summary), and the
time the stamp was taken.

An entry is used only while the run's ref still has that stamp (or, where the medium gives no stamps, still
names that target), so the index never disagrees with the runs: a run resumed, deleted, re-tagged, or still
running is read from its own ref and manifest, and a stale entry is dropped at the next fold. Each file
carries an xxh3 checksum; a damaged or missing one is ignored and rebuilt. Deleting ``runs-index/`` loses
nothing. A stamp alone is trusted only once it is settled (the backend's
:meth:`~casmon.store.backend.base.Backend.stamp_settled`: the ref written ticks of its file clock before the
stamp was taken): two writes within one tick of a coarse clock (FAT, ext3, some NFS servers), with the inode reused, can
share a stamp, so a younger entry is checked against the ref's target (one small read). A stamp is taken
before the ref is read, so a ref rewritten in between gets an entry whose stamp no
longer matches anything (never one that matches the new ref with the old content).
"""

from __future__ import annotations

import bisect
import json
import os
import re
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from casmon import faultpoints
from casmon.errors import CasmonError, DamagedObjectError
from casmon.runs.manifest import HEAVY, RUN_REFS, check_run_manifest
from casmon.runs.metrics import number_of

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["INDEX_DIR", "BASE", "FOLD_AT", "ENTRY_MAX", "Entry", "load", "fold", "entry", "note_ended",
           "indexable", "encode", "decode", "slim", "summary", "HEAVY", "settled", "renewed", "Columns", "COLUMNS",
           "columns", "pack"]

INDEX_DIR = "runs-index/"
BASE = INDEX_DIR + "base"
_DELTA = "d-"
_MAGIC = b"casmon-runs-index 8 "
#: New entries (runs read directly) plus delta files from which a listing writes a new base.
FOLD_AT = 32
#: A manifest larger than this (JSON bytes) is not copied into the index: the run is read directly.
ENTRY_MAX = 16384
#: The largest index file read (a crafted one is ignored, never read whole into memory).
FILE_MAX = 1 << 31

_HEX32 = re.compile(r"[0-9a-f]{32}")

#: ``[stamp, target hex, slim manifest, {"heartbeat"}, metric summary, start, name, status, time the stamp was
#: taken, settled]`` (settled: the stamp was found settled already, :func:`settled`; a made entry may leave it
#: out). Read from a file, the slim manifest (without HEAVY and metrics) is JSON text, parsed and checked
#: only when a field of it is read (:class:`~casmon.runs.listing.IndexedManifest`), and the summary is
#: ``(columns, row)``: cells made when asked for (:func:`summary`). An entry made from a run just read holds
#: its manifest (a dict) and summary (a dict) instead.
Entry = list

#: Statuses an ended run has, by their code in the file (another is written in the file's header).
_STATUSES = ("ok", "failed", "killed", "interrupted", "lost")
_U64 = np.dtype("<u8")


class Columns:
    """One index file's columns (numpy arrays, read in bulk): each row a run, the metric cells of row ``i``
    at ``cell_off[i]:cell_off[i + 1]`` of the cell columns. Python lists of the cell columns are made the first
    time a run's summary is asked for; a parameter column's cells, or the runs' tags, the first time a sort or
    a filter asks for them."""

    __slots__ = ("n", "keys", "metrics", "statuses", "a", "fields", "texts", "_cells", "_fields", "_tags", "_asked")

    def __init__(self, n: int, keys: list[str], metrics: list[str], statuses: list[str],
                 a: dict[str, Any], fields: list[str] | None = None, texts: list[str] | None = None) -> None:
        self.n, self.keys, self.metrics, self.statuses, self.a = n, keys, metrics, statuses, a
        self.fields: dict[str, int] = {f: i for i, f in enumerate(fields or [])}
        self.texts: list[str] = texts or []
        self._cells: tuple[list[Any], ...] | None = None
        self._asked = 0
        self._fields: dict[Any, Any] = {}
        self._tags: list[tuple[str, ...]] | None = None

    def cells(self) -> tuple[list[Any], ...]:
        if self._cells is None:
            a = self.a
            dg = a["digest"].tobytes().decode("ascii")
            has = a["has_digest"].tolist()
            self._cells = (a["cell_off"].tolist(), [self.metrics[m] for m in a["metric"].tolist()], a["last"].tolist(),
                           a["time"].tolist(), a["min"].tolist(), a["max"].tolist(), a["count"].tolist(),
                           a["step"].tolist(), [dg[32 * j: 32 * j + 32] if h else None for j, h in enumerate(has)])
        return self._cells

    def summary(self, row: int) -> dict[str, dict[str, Any]]:
        """Row ``row``'s metric cells (a new dict each call): the first few asked for (a page's) sliced from the
        columns, then every row's made at once (a listing's)."""
        if self._cells is None and self._asked < _SLICED:
            self._asked += 1
            a = self.a
            i, j = int(a["cell_off"][row]), int(a["cell_off"][row + 1])
            names = [self.metrics[m] for m in a["metric"][i:j].tolist()]
            dg = a["digest"][32 * i: 32 * j].tobytes().decode("ascii")
            cols = [a[f][i:j].tolist() for f in ("count", "last", "step", "time", "min", "max", "has_digest")]
            return {names[k]: {"n": cols[0][k], "last": cols[1][k], "step": cols[2][k], "time": cols[3][k],
                               "min": cols[4][k], "max": cols[5][k],
                               "digest": dg[32 * k: 32 * k + 32] if cols[6][k] else None} for k in range(j - i)}
        off, names, last, t, lo, hi, n, step, dg = self._cells or self.cells()
        return {names[j]: {"n": n[j], "last": last[j], "step": step[j], "time": t[j], "min": lo[j], "max": hi[j],
                           "digest": dg[j]} for j in range(off[row], off[row + 1])}

    def metric(self, name: str, field: str = "last") -> tuple[Any, Any]:
        """``(values, present)``: metric ``name``'s ``field`` (last, min, max, time, count, step) of every row,
        and which rows have the metric."""
        a = self.a
        vals = np.full(self.n, np.nan if field not in ("count", "step") else 0, a[field].dtype)
        present = np.zeros(self.n, bool)
        if name in self.metrics:
            mid = self.metrics.index(name)
            rows = np.repeat(np.arange(self.n), np.diff(a["cell_off"]))
            hit = a["metric"] == mid
            vals[rows[hit]] = a[field][hit]
            present[rows[hit]] = True
        return vals, present

    def flat(self, row: int, names: Any) -> dict[str, Any] | None:
        """Row ``row``'s cells of columns ``names`` (``param.KEY``, ``info.KEY``) as the run's table row holds
        them; None where only the run's row can say (a stored value, a list among its parameters, a key past
        the columns' fields)."""
        flag = int(self.a["flag"][row])
        if flag & FLAT_ROW or flag & FLAT_MORE and any(c not in self.fields for c in names):
            return None
        out = {}
        for c in names:
            got = self.field(c)
            if row in got:
                out[c] = got[row]
        return out

    def field(self, name: str) -> dict[int, Any]:
        """Column ``name``'s cells by row, for the rows that have it (none for a name past the fields)."""
        got = self._fields.get(name)
        if got is None:
            a = self.a
            got = {}
            fid = self.fields.get(name)
            if fid is not None:
                hit = np.flatnonzero(a["field"] == fid)
                rows = (np.searchsorted(a["fcell_off"], hit, "right") - 1).tolist()
                kinds, nums, strs, texts = a["fkind"][hit].tolist(), a["fnum"][hit].tolist(), a["fstr"][hit].tolist(), \
                    self.texts
                for r, k, x, j in zip(rows, kinds, nums, strs):
                    got[r] = x if k == 0 else int(x) if k == 1 else x == 1.0 if k == 2 else texts[j] if k == 3 else None
            self._fields[name] = got
        return got

    def flat_rows(self) -> list[dict[str, Any]]:
        """Every row's parameter and info cells from the columns (a fold copies them into the next file)."""
        got = self._fields.get(())
        if got is None:
            a, texts = self.a, self.texts
            names = list(self.fields)
            off = a["fcell_off"].tolist()
            cells = [(names[f], x if k == 0 else int(x) if k == 1 else x == 1.0 if k == 2 else texts[j] if k == 3
                      else None) for f, k, x, j in zip(a["field"].tolist(), a["fkind"].tolist(), a["fnum"].tolist(),
                                                       a["fstr"].tolist())]
            got = self._fields[()] = [dict(cells[off[r]: off[r + 1]]) for r in range(self.n)]
        return got

    def dense(self, name: str) -> tuple[Any, Any, Any]:
        """Column ``name`` (``param.KEY``, ``info.KEY``) of every row: ``(kind, number, text code)`` arrays, kind
        -1 where the row has no such cell, -2 where only the run's row can say, else 0 float, 1 int, 2 yes/no
        (number 0 or 1), 3 text (its code in ``texts``), 4 empty (null)."""
        got = self._fields.get((name,))
        if got is None:
            a = self.a
            kind, num, code = np.full(self.n, -1, "i1"), np.zeros(self.n, "<f8"), np.zeros(self.n, "<i8")
            fid = self.fields.get(name)
            if fid is not None:
                hit = np.flatnonzero(a["field"] == fid)
                rows = np.searchsorted(a["fcell_off"], hit, "right") - 1
                kind[rows], num[rows], code[rows] = a["fkind"][hit], a["fnum"][hit], a["fstr"][hit]
            flag = a["flag"]
            kind[(flag & FLAT_ROW).astype(bool) | ((flag & FLAT_MORE).astype(bool) & (fid is None))] = -2
            got = (kind, num, code)
            self._fields[(name,)] = got
        return got

    def tagged(self, tag: str) -> Any:
        """Which rows' manifests tag them ``tag`` (rows only their row can say for are left False)."""
        a = self.a
        out = np.zeros(self.n, bool)
        code = bisect.bisect_left(self.texts, tag)  # the texts are sorted
        if code == len(self.texts) or self.texts[code] != tag:
            return out
        hit = np.flatnonzero(a["tag"] == code)
        out[np.searchsorted(a["tag_off"], hit, "right") - 1] = True
        out[(a["flag"] & FLAT_ROW).astype(bool)] = False
        return out

    def tags(self, row: int) -> tuple[str, ...] | None:
        """Row ``row``'s tags as its manifest gives them (before any edit); None where only its row can say."""
        if self._tags is None:
            off, codes, texts = self.a["tag_off"].tolist(), self.a["tag"].tolist(), self.texts
            self._tags = [tuple(texts[c] for c in codes[off[i]: off[i + 1]]) for i in range(self.n)]
        return None if self.a["flag"][row] & FLAT_ROW else self._tags[row]


#: Rows' metric summaries made one at a time before every row's are made at once.
_SLICED = 256
#: A row's flags: its parameter and info cells and tags are read from its row (a stored value, a list among its
#: parameters, a manifest not read as one); it has keys past the columns' fields.
FLAT_ROW, FLAT_MORE = 1, 2
#: At most this many ``param.``/``info.`` keys (the most common) get columns; a run's others are read from its row.
FIELDS_MAX = 256
_EXACT = float(1 << 53)


def flat(m: dict[str, Any], text: str) -> tuple[int, dict[str, Any], tuple[str, ...]]:
    """Of slim manifest ``m`` (``text`` its JSON): ``(flag, the param./info. cells the run's table row holds,
    its tags before any edit)``; a cell whose value the columns cannot hold exactly sets ``FLAT_ROW``."""
    from casmon.runs.params import flatten
    from casmon.runs.tags import merged

    cells: dict[str, Any] = {}
    params, info = m.get("params", {}), m.get("info", {})
    if type(params) is not dict or type(info) is not dict or '"$"' in text:
        return FLAT_ROW, {}, ()
    for k, v in flatten(params).items():
        cells["param." + k] = v
    for k, v in flatten(info).items():
        if v is None or type(v) in (str, int, float, bool):
            cells["info." + k] = v
    for v in cells.values():
        if not (v is None or type(v) in (str, float, bool) or type(v) is int and -_EXACT <= v <= _EXACT):
            return FLAT_ROW, {}, ()
    return 0, cells, merged(m, [])[0]


def _flat_of(e: Entry) -> tuple[int, dict[str, Any], tuple[str, ...]]:
    if type(e[4]) is tuple:
        cols, i = e[4]
        flag = int(cols.a["flag"][i])
        if flag & FLAT_ROW:
            return FLAT_ROW, {}, ()
        if not flag & FLAT_MORE:
            tags = cols.tags(i)
            if tags is not None:
                return 0, dict(cols.flat_rows()[i]), tags
    m = slim(e, f"runs index entry {e[6]}")
    return flat(m, _slim_text(e)) if m is not None else (FLAT_ROW, {}, ())


#: The file's columns: name, dtype, rows (``n``: one a run, ``n+1``: offsets, ``c``: one a metric cell, ``b``: a
#: blob's bytes). Blobs hold their rows' text back to back, each row's at ``off[i]:off[i + 1]``.
COLUMNS = (("key_off", "<i8", "n+1"), ("key", "u1", "b"), ("stamp_off", "<i8", "n+1"), ("stamp", "u1", "b"),
            ("target", "u1", "32n"), ("slim_off", "<i8", "n+1"), ("slim", "u1", "b"), ("name_off", "<i8", "n+1"),
            ("name", "u1", "b"), ("start", "<f8", "n"), ("end", "<f8", "n"), ("at", "<f8", "n"),
            ("heartbeat", "<f8", "n"), ("settled", "u1", "n"), ("status", "<u2", "n"), ("number", "<i8", "n"),
            ("cell_off", "<i8", "n+1"),
            ("metric", "<u4", "c"), ("last", "<f8", "c"), ("time", "<f8", "c"), ("min", "<f8", "c"),
            ("max", "<f8", "c"), ("count", "<i8", "c"), ("step", "<i8", "c"), ("has_digest", "u1", "c"),
            ("digest", "u1", "32c"),
            ("flag", "u1", "n"), ("fcell_off", "<i8", "n+1"), ("field", "<u4", "f"), ("fkind", "u1", "f"),
            ("fnum", "<f8", "f"), ("fstr", "<u4", "f"), ("fname_off", "<i8", "k+1"), ("fname", "u1", "b"),
            ("tag_off", "<i8", "n+1"), ("tag", "<u4", "t"), ("text_off", "<i8", "s+1"), ("text", "u1", "b"))


def _slim_text(e: Entry) -> str:
    return e[2] if type(e[2]) is str else json.dumps(e[2], separators=(",", ":"))


def _blob(texts: list[str]) -> tuple[Any, Any]:
    parts = [t.encode("utf-8", "surrogatepass") for t in texts]
    off = np.zeros(len(parts) + 1, "<i8")
    np.cumsum([len(p) for p in parts], out=off[1:])
    return off, np.frombuffer(b"".join(parts), "u1")


def _number(x: Any, lo: float = -np.inf, hi: float = np.inf) -> float:
    return float(x) if type(x) in (int, float) and lo <= x < hi else np.nan


def encode(entries: dict[str, Entry]) -> bytes:
    rows: list[tuple[str, Entry, dict[str, dict[str, Any]]]] = []
    for name, e in entries.items():
        cells = summary(e)
        if cells is None:  # a crafted entry's columns: left out, the run is read directly and indexed again
            continue
        rows.append((name, e, cells))
    metrics = sorted({k for _n, _e, c in rows for k in c})
    mids = {k: i for i, k in enumerate(metrics)}
    statuses = list(_STATUSES) + sorted({e[7] for _n, e, _c in rows} - set(_STATUSES))
    codes = {s: i for i, s in enumerate(statuses)}
    cols: dict[str, Any] = {}
    cols["key_off"], cols["key"] = _blob([n for n, _e, _c in rows])
    cols["stamp_off"], cols["stamp"] = _blob([e[0] for _n, e, _c in rows])
    cols["target"] = np.frombuffer("".join(e[1] for _n, e, _c in rows).encode("ascii"), "u1")
    cols["slim_off"], cols["slim"] = _blob([_slim_text(e) for _n, e, _c in rows])
    cols["name_off"], cols["name"] = _blob([e[6] for _n, e, _c in rows])
    cols["start"] = np.array([e[5] for _n, e, _c in rows], "<f8")
    cols["end"] = np.array([_end_of(e) for _n, e, _c in rows], "<f8")
    cols["at"] = np.array([e[8] for _n, e, _c in rows], "<f8")
    cols["heartbeat"] = np.array([_number(e[3].get("heartbeat"), 0, 1e11) for _n, e, _c in rows], "<f8")
    cols["settled"] = np.array([len(e) > 9 and e[9] is True for _n, e, _c in rows], "u1")
    cols["status"] = np.array([codes[e[7]] for _n, e, _c in rows], "<u2")
    cols["number"] = np.array([_number_of(e) for _n, e, _c in rows], "<i8")
    made = [(mids[k], c[k]) for _n, _e, c in rows for k in sorted(c)]
    cols["cell_off"] = np.zeros(len(rows) + 1, "<i8")
    np.cumsum([len(c) for _n, _e, c in rows], out=cols["cell_off"][1:])
    cols["metric"] = np.array([m for m, _c in made], "<u4")
    for f in ("last", "time", "min", "max"):
        cols[f] = np.array([c[f] for _m, c in made], "<f8")
    cols["count"] = np.array([c["n"] for _m, c in made], "<i8")
    cols["step"] = np.array([c["step"] for _m, c in made], "<i8")
    cols["has_digest"] = np.array([c["digest"] is not None for _m, c in made], "u1")
    cols["digest"] = np.frombuffer("".join(c["digest"] or "0" * 32 for _m, c in made).encode("ascii"), "u1")
    _encode_flat(cols, [_flat_of(e) for _n, e, _c in rows])
    return pack(len(rows), metrics, statuses, cols)


def _encode_flat(cols: dict[str, Any], flats: list[tuple[int, dict[str, Any], tuple[str, ...]]]) -> None:
    """The parameter, info and tag columns of rows ``flats`` (:func:`flat`): the ``FIELDS_MAX`` most common keys."""
    count: dict[str, int] = {}
    for _f, cells, _t in flats:
        for k in cells:
            count[k] = count.get(k, 0) + 1
    fields = sorted(sorted(count, key=lambda k: (-count[k], k))[:FIELDS_MAX])
    fid = {f: i for i, f in enumerate(fields)}
    texts = sorted({v for _f, c, _t in flats for k, v in c.items() if type(v) is str and k in fid}
                   | {t for _f, _c, tags in flats for t in tags})
    tid = {t: i for i, t in enumerate(texts)}
    flag, cell_off, field, kind, num, code, tag_off, tag = [], [0], [], [], [], [], [0], []
    for f, cells, tags in flats:
        for k in sorted(cells):
            if k not in fid:
                f |= FLAT_MORE
                continue
            v = cells[k]
            field.append(fid[k])
            kind.append(0 if type(v) is float else 1 if type(v) is int else 2 if type(v) is bool else
                        3 if type(v) is str else 4)
            num.append(float(v) if type(v) in (int, float, bool) else 0.0)
            code.append(tid[v] if type(v) is str else 0)
        flag.append(f)
        cell_off.append(len(field))
        tag.extend(sorted(tid[t] for t in tags))
        tag_off.append(len(tag))
    cols["flag"] = np.array(flag, "u1")
    cols["fcell_off"] = np.array(cell_off, "<i8")
    cols["field"], cols["fkind"] = np.array(field, "<u4"), np.array(kind, "u1")
    cols["fnum"], cols["fstr"] = np.array(num, "<f8"), np.array(code, "<u4")
    cols["fname_off"], cols["fname"] = _blob(fields)
    cols["tag_off"], cols["tag"] = np.array(tag_off, "<i8"), np.array(tag, "<u4")
    cols["text_off"], cols["text"] = _blob(texts)


def _check_flat(a: dict[str, Any], n: int, key: str) -> tuple[list[str], list[str]]:
    """The parameter and tag columns checked as a whole: ``(field names, texts)``; DamagedObjectError if not
    as casmon writes them."""
    fields = _texts(a["fname_off"], a["fname"], "field name", key)
    texts = _texts(a["text_off"], a["text"], "text", key)
    f, t = len(a["field"]), len(a["tag"])
    if (len(set(fields)) != len(fields) or texts != sorted(set(texts))
            or not all(x.startswith(("param.", "info.")) and not x.endswith(".") for x in fields)):
        raise DamagedObjectError(key, "its parameter fields or texts are not named once each")
    _check_rows(a["fcell_off"], a["field"], f, key, "parameter")
    _check_rows(a["tag_off"], a["tag"], t, key, "tag")
    kind, num, code = a["fkind"], a["fnum"], a["fstr"]
    ints = kind == 1
    if not (bool((a["flag"] <= FLAT_ROW | FLAT_MORE).all()) and bool((kind <= 4).all())
            and bool((a["field"] < len(fields)).all()) and bool((a["tag"] < len(texts)).all())
            and bool((np.abs(num[ints]) <= _EXACT).all()) and bool((num[ints] == np.floor(num[ints])).all())
            and bool(np.isin(num[kind == 2], (0.0, 1.0)).all()) and bool((code[kind == 3] < len(texts)).all())
            and len(np.unique(a["field"])) == len(fields)
            and len(np.union1d(code[kind == 3], a["tag"])) == len(texts)):
        raise DamagedObjectError(key, "a parameter's field, kind, value or text, or a tag, is out of range")
    return fields, texts


def _check_rows(off: Any, codes: Any, c: int, key: str, what: str) -> None:
    """Offsets ``off`` fit ``c`` cells, and each row's ``codes`` rise (each named once)."""
    if len(off) == 0 or off[0] != 0 or off[-1] != c or bool((np.diff(off) < 0).any()):
        raise DamagedObjectError(key, f"its {what} cell offsets do not fit its cells")
    if c > 1:
        step = np.diff(codes.astype("<i8"))
        inner = np.ones(c - 1, bool)
        inner[off[1:-1][(off[1:-1] > 0) & (off[1:-1] < c)] - 1] = False
        if bool((step[inner] <= 0).any()):
            raise DamagedObjectError(key, f"a run's {what}s are not each named once")


def pack(n: int, metrics: list[str], statuses: list[str], cols: dict[str, Any]) -> bytes:
    """An index file of ``n`` runs holding columns ``cols`` as they are (tests craft files with it)."""
    parts, at = [], 0
    layout = {}
    for name, dtype, _rows in COLUMNS:
        arr = np.ascontiguousarray(cols[name], dtype)
        raw = arr.tobytes()
        raw += bytes(-len(raw) % 8)
        layout[name] = [at, len(arr)]
        parts.append(raw)
        at += len(raw)
    head = json.dumps({"n": n, "metrics": metrics, "statuses": statuses, "cols": layout},
                      separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    body = np.array([len(head)], _U64).tobytes() + head + b"".join(parts)
    return _MAGIC + xxhash.xxh3_128_hexdigest(body).encode() + b"\n" + body


def _end_of(e: Entry) -> float:
    if type(e[4]) is tuple:
        cols, i = e[4]
        return float(cols.a["end"][i])
    return _number(e[2].get("end"), 0, 1e11) if type(e[2]) is dict else np.nan


def _number_of(e: Entry) -> int:
    if type(e[4]) is tuple:
        cols, i = e[4]
        return int(cols.a["number"][i])
    n = e[2].get("n") if type(e[2]) is dict else None
    return n if type(n) is int and -(1 << 62) < n < 1 << 62 else -1


def _texts(off: Any, blob: Any, what: str, key: str) -> list[str]:
    """The rows of a blob column; DamagedObjectError if its offsets do not fit it or its text is not UTF-8."""
    if len(off) == 0 or off[0] != 0 or off[-1] != len(blob) or bool((np.diff(off) < 0).any()):
        raise DamagedObjectError(key, f"its {what} offsets do not fit its {what} column")
    raw = blob.tobytes()
    try:
        if raw.isascii():
            text = raw.decode("ascii")
            o = off.tolist()
            return [text[o[i]: o[i + 1]] for i in range(len(o) - 1)]
        o = off.tolist()
        return [raw[o[i]: o[i + 1]].decode("utf-8", "surrogatepass") for i in range(len(o) - 1)]
    except UnicodeDecodeError:
        raise DamagedObjectError(key, f"its {what} column is not text") from None


def columns(raw: bytes, key: str) -> Columns:
    """Index file ``key``'s columns, each checked as a whole (lengths, offsets, ranges: numbers that are not
    finite where a time must be, codes out of range); :class:`DamagedObjectError` naming it and what is wrong if
    it is not one casmon wrote."""
    head = len(_MAGIC) + 33
    if not raw.startswith(_MAGIC) or len(raw) < head + 8 or raw[head - 1: head] != b"\n":
        raise DamagedObjectError(key, "not a runs index file")
    body = memoryview(raw)[head:]
    if xxhash.xxh3_128_hexdigest(body).encode() != raw[len(_MAGIC): head - 1]:
        raise DamagedObjectError(key, "its content does not match its checksum")
    hl = int(np.frombuffer(body[:8], _U64)[0])
    try:
        if hl > len(body) - 8:
            raise ValueError
        doc = json.loads(bytes(body[8: 8 + hl]))
        n, metrics, statuses, layout = doc["n"], doc["metrics"], doc["statuses"], doc["cols"]
        if not (type(n) is int and 0 <= n and type(metrics) is list and all(type(m) is str for m in metrics)
                and len(set(metrics)) == len(metrics) and type(statuses) is list
                and all(type(x) is str and x not in ("running", "claimed", "unreadable") for x in statuses)
                and type(layout) is dict):
            raise ValueError
    except (ValueError, KeyError, TypeError, RecursionError):
        raise DamagedObjectError(key, "its header is not a runs index's") from None
    data = body[8 + hl:]
    a: dict[str, Any] = {}
    for name, dtype, rows in COLUMNS:
        got = layout.get(name)
        if not (type(got) is list and len(got) == 2 and all(type(x) is int and x >= 0 for x in got)):
            raise DamagedObjectError(key, f"its header does not place column {name}")
        at, count = got
        size = count * np.dtype(dtype).itemsize
        if at % 8 or at + size > len(data):
            raise DamagedObjectError(key, f"its column {name} runs past the file's end")
        a[name] = np.frombuffer(data[at: at + size], dtype)
    c = len(a["metric"])
    want = {"n": n, "n+1": n + 1, "32n": 32 * n, "c": c, "32c": 32 * c, "f": len(a["field"]), "t": len(a["tag"])}
    for name, _dtype, rows in COLUMNS:
        if rows in want and len(a[name]) != want[rows]:
            raise DamagedObjectError(key, f"its column {name} holds {len(a[name])} values, not {want[rows]}")
    keys = _texts(a["key_off"], a["key"], "run name", key)
    prefix = RUN_REFS + "/"
    if len(set(keys)) != n or not all(k.startswith(prefix) for k in keys):
        raise DamagedObjectError(key, "its runs are not named once each under runs/")
    co = a["cell_off"]
    if len(co) == 0 or co[0] != 0 or co[-1] != c or bool((np.diff(co) < 0).any()):
        raise DamagedObjectError(key, "its metric cell offsets do not fit its cells")
    start, at_, hb, end = a["start"], a["at"], a["heartbeat"], a["end"]
    ok = (bool(((start >= 0) & (start < 1e11)).all()) and bool(((at_ >= 0) & (at_ < 1e11)).all())
          and bool((np.isnan(hb) | ((hb >= 0) & (hb < 1e11))).all())
          and bool((np.isnan(end) | ((end >= 0) & (end < 1e11))).all()))
    if not ok:
        raise DamagedObjectError(key, "a run's start, end, heartbeat or time is not a time")
    if not bool((a["status"] < len(statuses)).all()) or not bool((a["settled"] <= 1).all()):
        raise DamagedObjectError(key, "a run's status code is out of range")
    t = a["time"]
    if not (bool((a["metric"] < len(metrics)).all()) and bool((a["count"] >= 0).all())
            and bool(((t >= 0) & (t < 1e11)).all()) and bool((a["has_digest"] <= 1).all())):
        raise DamagedObjectError(key, "a metric's name, count or time is out of range")
    if c > 1:  # each run's metrics by name, once each
        m = a["metric"].astype("<i8")
        step = np.diff(m)
        inner = np.ones(c - 1, bool)
        inner[co[1:-1][(co[1:-1] > 0) & (co[1:-1] < c)] - 1] = False
        if bool((step[inner] <= 0).any()):
            raise DamagedObjectError(key, "a run's metrics are not each named once")
    if not _hex(a["target"]) or not _hex(a["digest"]):
        raise DamagedObjectError(key, "a run's manifest or a metric's digest is not hex")
    fields, texts = _check_flat(a, n, key)
    return Columns(n, keys, metrics, statuses, a, fields, texts)


_HEX_BYTES = np.zeros(256, bool)
_HEX_BYTES[list(b"0123456789abcdef")] = True


def _hex(b: Any) -> bool:
    """Every byte of ``b`` a lowercase hex digit."""
    return bool(_HEX_BYTES[b].all())


def decode(raw: bytes, key: str) -> dict[str, Entry]:
    """The entries of index file ``key`` (its columns checked as a whole: :func:`columns`; each manifest's
    fields checked when read: :func:`slim`); :class:`DamagedObjectError` naming it if it is not one casmon
    wrote."""
    cols = columns(raw, key)
    a = cols.a
    stamps = _texts(a["stamp_off"], a["stamp"], "stamp", key)
    slims = _texts(a["slim_off"], a["slim"], "manifest", key)
    names = _texts(a["name_off"], a["name"], "name", key)
    tg = a["target"].tobytes().decode("ascii")
    st = [cols.statuses[x] for x in a["status"].tolist()]
    hbs = [{} if h != h else {"heartbeat": h} for h in a["heartbeat"].tolist()]
    return {k: [stamps[i], tg[32 * i: 32 * i + 32], slims[i], hbs[i], (cols, i), s0, names[i], st[i], t, d]
            for i, (k, s0, t, d) in enumerate(zip(cols.keys, a["start"].tolist(), a["at"].tolist(),
                                                   (a["settled"] == 1).tolist()))}


def slim(e: Entry, where: str) -> dict[str, Any] | None:
    """Entry ``e``'s slim manifest, checked as a manifest read from the store is (and of an ended run, starting
    when the entry says); None if it is not such (a crafted entry: the stored manifest is read instead)."""
    if type(e[2]) is dict:
        return dict(e[2])
    try:
        m = json.loads(e[2])
        if (type(m) is not dict or not indexable(m) or "metrics" in m
                or (m.get("start"), m.get("name"), m.get("status")) != (e[5], e[6], e[7])):
            return None
        check_run_manifest(m, where)
    except (ValueError, RecursionError, DamagedObjectError):
        return None
    return m


def summary(e: Entry) -> dict[str, dict[str, Any]] | None:
    """Entry ``e``'s metric summary as :meth:`~casmon.runs.listing.RunInfo.metric_summary` gives it (a new
    dict each call); None if its columns are not of the form casmon writes."""
    if type(e[4]) is dict:
        return {k: dict(v) for k, v in e[4].items()}
    if type(e[4]) is not tuple:
        return None
    cols, row = e[4]
    return cols.summary(row)


#: The base file last read, by store: ``(its stamp, its entries)``; a listing whose base has the same stamp
#: reads nothing (entries are not changed once read: readers copy what they change).
_read: dict[str, tuple[str, dict[str, Entry]]] = {}
_read_lock = threading.Lock()
_READ_KEPT = 4


def load(store: Store) -> tuple[dict[str, Entry], list[str], bool]:
    """``(entries, delta keys read, whether the base was sound)``; damaged files are left out."""
    b = store.backend
    entries: dict[str, Entry] = {}
    base_ok = False
    try:
        stamp = b.stamp(BASE)  # before the read: a base replaced meanwhile is kept under a stamp gone already
        with _read_lock:
            got = _read.get(store.url) if stamp is not None else None
        if got is not None and got[0] == stamp:
            entries, base_ok = dict(got[1]), True
        else:
            raw = b.get(BASE)
            if raw is not None and len(raw) <= FILE_MAX:
                entries = decode(bytes(raw), BASE)
                base_ok = True
                if stamp is not None:
                    with _read_lock:
                        _read.pop(store.url, None)
                        _read[store.url] = (stamp, dict(entries))
                        while len(_read) > _READ_KEPT:
                            _read.pop(next(iter(_read)))
    except (CasmonError, OSError, MemoryError):
        pass  # rebuilt by the next fold
    deltas = sorted(k for k in _list(store) if k.rsplit("/", 1)[-1].startswith(_DELTA) and ".partial" not in k)
    for k in deltas:
        try:
            raw = b.get(k)
            if raw is not None and len(raw) <= ENTRY_MAX * 4:
                entries.update(decode(bytes(raw), k))
        except (CasmonError, OSError):
            continue
    return entries, deltas, base_ok


def _list(store: Store) -> list[str]:
    try:
        return store.backend.list(INDEX_DIR)
    except OSError:
        return []


def indexable(manifest: dict[str, Any]) -> bool:
    """True for the manifest of a run that has ended (its manifest will not change while its ref stays)."""
    return manifest.get("status") not in ("running", "claimed", "unreadable", None)


def settled(store: Store, e: Entry, now: float) -> bool:
    """True if entry ``e``'s stamp alone says its ref is unchanged: the ref was written well before the stamp
    was taken, so no later write can share the stamp (see the module's docstring). An entry made by a clock
    ahead of this one (``now``) counts as made now."""
    if len(e) > 9 and e[9] and e[8] <= now:
        return True  # found settled already: a stamp taken at a time stays settled
    if store.backend.stamp_settled(e[0], min(e[8], now)):
        if e[8] <= now:
            e[9:] = [True]
        return True
    return False


def renewed(e: Entry, stamp: str, ref_data: dict[str, Any], at: float) -> Entry:
    """Entry ``e`` (of the manifest the ref names now) with the ref's ``stamp`` taken at time ``at``."""
    hb = ref_data.get("heartbeat")
    return [stamp, e[1], e[2], {"heartbeat": hb} if type(hb) is float else {}, e[4], e[5], e[6], e[7], at, False]


def entry(stamp: str, target: str, manifest: dict[str, Any], ref_data: dict[str, Any],
          at: float) -> Entry | None:
    """An index entry (``stamp`` taken at time ``at``, before the ref was read), or None for a manifest too large to copy or with a metric cell of an odd form (that
    run is read directly)."""
    try:
        size = len(json.dumps(manifest, separators=(",", ":")))
    except (TypeError, ValueError, RecursionError):
        return None
    summary = manifest.get("metrics")
    cells = _cells(summary if isinstance(summary, dict) else {})
    if size > ENTRY_MAX or cells is None:
        return None
    slim = {k: v for k, v in manifest.items() if k not in HEAVY and k != "metrics"}
    # Of the ref's data only the last heartbeat says more than the manifest once a run has ended.
    hb = ref_data.get("heartbeat")
    start: Any = slim.get("start")
    name, status = slim.get("name"), slim.get("status")
    if type(start) not in (int, float) or not 0 <= start < 1e11 or type(name) is not str or type(status) is not str:
        return None
    return [stamp, target, slim, {"heartbeat": hb} if type(hb) is float else {}, cells, start, name, status, at]


def _cells(summary: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """A manifest's metric summary as :meth:`~casmon.runs.listing.RunInfo.metric_summary` gives it; None if
    a cell is not of the form a recorder writes."""
    out = {}
    for k in sorted(summary):
        v = summary[k]
        if type(k) is not str or not isinstance(v, dict):
            return None
        n, step, d = v.get("n"), v.get("step"), v.get("digest")
        last, t, lo, hi = (number_of(v.get(f)) for f in ("last", "time", "min", "max"))
        if (type(n) is not int or not 0 <= n < 1 << 63 or type(step) is not int or not -(1 << 63) <= step < 1 << 63
                or not all(type(x) is float for x in (last, t, lo, hi)) or not 0 <= t < 1e11  # type: ignore[operator]
                or not (d is None or type(d) is str and _HEX32.fullmatch(d))):
            return None
        out[k] = {"n": n, "last": last, "step": step, "time": t, "min": lo, "max": hi, "digest": d}
    return out


def fold(store: Store, entries: dict[str, Entry], fresh: dict[str, Entry], deltas: list[str],
         stamps: dict[str, str] | None, base_ok: bool, settled_now: int = 0) -> bool:
    """Write a new base (entries still current, plus ``fresh``) and delete the ``deltas`` it holds, when
    enough is new (``settled_now``: entries found settled that the file does not mark so); best effort (a
    read-only store, a full disk: the next listing tries again)."""
    if store.read_only or not (len(fresh) + len(deltas) + settled_now >= FOLD_AT or (fresh and not base_ok)):
        return False
    keep = {n: e for n, e in entries.items()
            if stamps is None or stamps.get("refs/" + n) == e[0]}  # deleted or rewritten runs' entries go
    keep.update(fresh)
    try:
        store.backend.set(BASE, encode(keep))
        faultpoints.point("index.base_written")
        for k in deltas:
            store.backend.delete(k)
            faultpoints.point("index.delta_deleted")
    except (OSError, CasmonError):
        return False
    return True


def note_ended(store: Store, ref: str) -> None:
    """After a run's end is stored: its entry as a delta file, so listings need not read it (best effort)."""
    from casmon.runs.manifest import check_run_manifest as check
    from casmon.store.peek import load_data

    try:
        at = time.time()
        stamp = store.backend.stamp("refs/" + ref)  # before the ref is read: see the module's docstring
        r = store.get_ref(ref)
        if stamp is None or r is None or r.target is None:
            return
        manifest = load_data(store, r.target.hex(), f"run {ref}: its manifest", dict)
        check(manifest, f"run {ref}")
        if not indexable(manifest):
            return
        e = entry(stamp, r.target.hex(), manifest, r.data if isinstance(r.data, dict) else {}, at)
        if e is None:
            return
        key = f"{INDEX_DIR}{_DELTA}{time.time_ns():016x}-{os.urandom(4).hex()}"
        store.backend.set(key, encode({ref: e}))
        faultpoints.point("index.delta_written")
    except (OSError, CasmonError):
        pass  # the index is derived: the next listing reads the run directly
