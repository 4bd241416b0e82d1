"""The runs' part of the store's zarr view: ``runs/{name}`` (listed from the runs' refs; a run's manifest and
metric batches read when its node is first asked for), and ``runs/{name}/metrics/{metric}`` groups of
``step``, ``value`` and ``time`` arrays.

A run's group carries its status, params, info, tags and note as attributes (stored values
described from their manifests, never loaded). A metric's arrays are chunked
by fixed ranges of :data:`METRIC_CHUNK` points over the run's metric batches
in the order they were logged; a chunk reads only the batches it overlaps.
"""

from __future__ import annotations

import asyncio
import bisect
import threading
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from casmon.errors import CasmonError, StoreDamageWarning
from casmon.runs.listing import IndexedManifest, RunInfo, list_runs, run_info
from casmon.runs.manifest import RUN_REFS, is_value_ref
from casmon.runs.metrics import KIND_METRICS, _cell_data, _cells, metrics_key
from casmon.store.records import parse_record
from casmon.store.arrayview import byte_slice
from casmon.store.peek import describe
from casmon.store.zarrview import Tree, array_metadata, install_section, node_name

if TYPE_CHECKING:
    from zarr.abc.buffer import Buffer, BufferPrototype
    from zarr.abc.store import ByteRequest

    from casmon.store.store import Store

__all__ = ["METRIC_CHUNK", "WHOLE_MAX", "build"]

#: Points per chunk of a metric's arrays (128 KiB of each column).
METRIC_CHUNK = 16384

#: Up to this many nodes (by the runs index's metric summaries), the ``runs`` group's ``zarr.json`` holds every
#: run's whole subtree as consolidated metadata (one read lists everything). More, and it holds none: zarr then
#: lists the runs and reads each run's group (its attributes) as asked, and a run's metrics when asked. 10,000
#: runs of 5 metrics are ~220,000 nodes, which zarr takes tens of seconds to parse at once; runs with no metrics
#: (two nodes each) list faster whole however many there are.
WHOLE_MAX = 10_000

_COLUMNS = (("step", "int64", np.dtype("<i8")), ("value", "float64", np.dtype("<f8")), ("time", "float64", np.dtype("<f8")))


class _Points:
    """The points of one metric of one run, read batch by batch as chunks ask for them (the last few kept, so
    the three columns of one chunk read each batch once)."""

    def __init__(self, store: Store, name: str, where: str, cells: list[dict[str, Any]]) -> None:
        self.store, self.name, self.where, self.cells = store, name, where, cells
        self.starts = [0]
        for c in cells:
            self.starts.append(self.starts[-1] + int(c["n"]))
        self.total = self.starts[-1]
        self._kept: dict[int, bytes] = {}
        self._lock = threading.Lock()
        self.batches_read = 0  # for tests: how many batches chunk reads loaded

    def _batch(self, j: int) -> bytes:
        with self._lock:
            got = self._kept.get(j)
        if got is None:
            got = _cell_data(self.store, self.name, self.cells[j], self.where)
            with self._lock:
                self.batches_read += 1
                if len(self._kept) >= 8:
                    self._kept.pop(next(iter(self._kept)))
                self._kept[j] = got
        return got

    def chunk(self, col: int, i: int) -> bytes:
        lo, hi = i * METRIC_CHUNK, min(self.total, (i + 1) * METRIC_CHUNK)
        dt = _COLUMNS[col][2]
        out = np.zeros(METRIC_CHUNK, dt)  # the last chunk is padded to full size
        j = bisect.bisect_right(self.starts, lo) - 1
        while j < len(self.cells) and self.starts[j] < hi:
            s, n = self.starts[j], int(self.cells[j]["n"])
            a, b = max(lo, s), min(hi, s + n)
            if b > a:
                col_data = np.frombuffer(self._batch(j), dt, n, col * 8 * n)
                out[a - lo : b - lo] = col_data[a - s : b - s]
            j += 1
        return out.tobytes()


class _Column:
    """One of a metric's arrays, as the chunks of its points."""

    def __init__(self, points: _Points, col: int) -> None:
        self.points, self.col = points, col
        self.nchunks = -(-points.total // METRIC_CHUNK)

    def _index(self, key: str) -> int | None:
        head, _, tail = key.partition("/")
        if head != "c" or not tail.isdigit():
            return None
        i = int(tail)
        return i if i < self.nchunks else None

    async def exists(self, key: str) -> bool:
        return self._index(key) is not None

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        i = self._index(key)
        if i is None:
            return None
        data = await asyncio.to_thread(self.points.chunk, self.col, i)
        return prototype.buffer.from_bytes(byte_slice(data, byte_range))


def _described(store: Store, v: Any) -> Any:
    """A run's param or info value for attributes: a stored value is its one-line description."""
    if is_value_ref(v):
        return describe(store, v["$"], 200)
    if isinstance(v, dict):
        return {k: _described(store, x) for k, x in v.items()}
    return v


#: The most points one stored batch may claim (96 GiB of points: far past any batch a run writes).
MAX_BATCH_POINTS = 2**32
#: The most points one metric may claim: its step array must stay one a reader can index.
MAX_POINTS = 2**40


def _bad_lengths(cells: list[dict[str, Any]]) -> str | None:
    """What is wrong with the point counts the batches claim, told without reading a stored batch: an inline
    batch holds exactly 24 bytes a point, a stored one at most :data:`MAX_BATCH_POINTS`; else None. A crafted
    count would make an array no zarr or xarray reader can open (past int64, or one allocation past memory)."""
    total = 0
    for c in cells:
        n, b64 = c["n"], c.get("b64")
        if isinstance(b64, str):
            if len(b64) % 4 or (len(b64) // 4 * 3 - len(b64[-2:]) + len(b64[-2:].rstrip("="))) != 24 * n:
                return f"a batch of {n} points holds {len(b64)} base64 characters"
        elif n > MAX_BATCH_POINTS:
            return f"a stored batch claims {n} points"
        total += n
    return f"its batches claim {total} points" if total > MAX_POINTS else None


def _run(store: Store, tree: Tree, r: RunInfo, records: list[dict[str, Any]] | CasmonError | None = None,
         lazy: bool = False) -> None:
    """Add run ``r``'s nodes; ``records``: its metric records, read already (or the error reading them gave).
    ``lazy``: its ``metrics`` group is listed and built when first asked for (its records read then)."""
    name = node_name(r.ref.split("/", 1)[-1])
    m = r.manifest
    get = m.listed if isinstance(m, IndexedManifest) else m.get  # an indexed run's fields: its manifest unread
    attrs: dict[str, Any] = {"name": r.name, "status": r.status, "start": get("start"), "end": get("end")}
    if r.error is not None:
        tree.group(f"runs/{name}", {**attrs, "error": str(r.error)[:500]})
        return
    attrs["params"] = _described(store, get("params") or {})
    attrs["info"] = _described(store, get("info") or {})
    attrs["tags"] = list(r.tags)  # with every edit since the start applied, as `casmon runs` shows them
    note = r.note
    if note:
        attrs["note"] = note
    tree.group(f"runs/{name}", attrs)
    if not lazy:
        _metrics(store, tree, r, name, records)
        return
    path = f"runs/{name}/metrics"
    read: list[dict[str, list[Any]]] = []

    def cells() -> dict[str, list[Any]]:
        if not read:
            read.append(_cells(store, r.ref, f"run {r.name}", None, None))
        return read[0]

    def names() -> list[str]:
        try:
            return [node_name(metric) for metric in cells()]
        except CasmonError as e:
            tree.group(path, {"error": str(e)[:500]})
            return []

    def some(todo: list[str]) -> None:
        got = cells()
        for metric in sorted(got):
            if node_name(metric) in todo:
                _metric(store, tree, r, name, metric, got[metric])

    tree.lazy(path, names, lambda node: some([node]), bulk=some)


def _metrics(store: Store, tree: Tree, r: RunInfo, name: str,
             records: list[dict[str, Any]] | CasmonError | None) -> None:
    try:
        if isinstance(records, CasmonError):
            raise records
        cells = _cells(store, r.ref, f"run {r.name}", None, records)
    except CasmonError as e:
        tree.group(f"runs/{name}/metrics", {"error": str(e)[:500]})
        return
    tree.group(f"runs/{name}/metrics")
    for metric in sorted(cells):
        _metric(store, tree, r, name, metric, cells[metric])


def _metric(store: Store, tree: Tree, r: RunInfo, name: str, metric: str, cells: list[Any]) -> None:
    path = f"runs/{name}/metrics/{node_name(metric)}"
    bad = _bad_lengths([c for _s, _i, c in cells])
    if bad is not None:
        tree.group(path, {"run": r.name, "metric": metric, "error": f"damaged: {bad}"})
        return
    points = _Points(store, metric, f"run {r.name}", [c for _s, _i, c in cells])
    tree.group(path, {"run": r.name, "metric": metric, "points": points.total})
    for col, (column, dtype, _dt) in enumerate(_COLUMNS):
        meta = array_metadata(dtype, (points.total,), (METRIC_CHUNK,), 0 if col == 0 else 0.0, ["step"])
        tree.array(f"{path}/{column}", meta, _Column(points, col))


def _nodes(runs: list[RunInfo]) -> int:
    """About how many nodes ``runs`` make whole: a group and its metrics group each, four nodes a metric
    (counted on up to :data:`_SAMPLE` runs spread over them: a summary not in the runs index is a read)."""
    step = max(1, len(runs) // _SAMPLE)
    sample = runs[::step]
    n = 0
    for r in sample:
        try:
            n += 2 + 4 * len(r.metric_summary() if r.error is None else ())
        except Exception:  # noqa: BLE001 - a run whose summary cannot be read counts as one metric
            n += 6
    return n * len(runs) // max(1, len(sample))


_SAMPLE = 256


def _metric_records(store: Store) -> dict[bytes, list[dict[str, Any]] | CasmonError]:
    """Every run's metric records, by their key, read in one pass over the table (a run whose records do not
    parse: the error, as its own lookup would raise it)."""
    raw: dict[bytes, list[tuple[bytes, bytes]]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StoreDamageWarning)  # a damaged table file is left out; verify says so
        for k, v in store.table(KIND_METRICS).items(strict=False):
            raw.setdefault(bytes(k), []).append((k, v))
    out: dict[bytes, list[dict[str, Any]] | CasmonError] = {}
    for key, items in raw.items():
        try:
            out[key] = [parse_record(KIND_METRICS, k, v) for k, v in items]
        except CasmonError as e:
            out[key] = e
    return out


def build(store: Store, tree: Tree) -> None:
    """Add the runs of ``store`` under ``runs/``: listed from the runs' refs through the runs index
    (:func:`~casmon.runs.listing.list_runs`: a run's attributes from its index entry, its manifest read only where
    the entry is stale), and built all at once when the ``runs`` group's metadata is asked for: up to
    :data:`WHOLE_MAX` nodes (or runs with almost no metrics) whole, with every metric record read in one pass
    (its ``zarr.json`` then holds the whole subtree: zarr lists it without a read per run); past that, the
    runs' groups, each run's metrics read when asked for. A run asked for alone is read from its ref and
    manifest."""
    refs: dict[str, str] = {}

    def names() -> list[str]:
        for ref in store.refs(RUN_REFS):
            refs.setdefault(node_name(ref.split("/", 1)[-1]), ref)
        return list(refs)

    def one(name: str) -> None:
        r = run_info(store, refs[name])
        if r is not None:
            _run(store, tree, r)

    def every(todo: list[str]) -> None:
        wanted = {refs[name] for name in todo}
        runs = [r for r in list_runs(store) if r.ref in wanted]  # one listed since is left to the next view
        nodes = _nodes(runs)
        # their groups now, a run's metrics when asked for; runs with (almost) no metrics list faster whole
        if nodes > WHOLE_MAX and 2 * nodes > 5 * len(runs):
            for r in runs:
                _run(store, tree, r, lazy=True)
            return
        records = _metric_records(store)
        for r in runs:
            _run(store, tree, r, records.get(bytes(metrics_key(r.ref)), []))

    tree.lazy("runs", names, one, bulk=every)


install_section("runs", build)
