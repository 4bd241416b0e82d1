"""Step-wise metrics of runs: ``run.log(loss=0.3)``, kept as columnar series and read back as numpy arrays.

A point is ``(step, value, time)``: an int64, a float64 and the wall time it
was logged at. ``run.log`` only appends to three typed arrays per metric
(``array.array``: 24 bytes a point, no Python object kept), so a point costs
about what ``json.dumps`` of the same dict costs. Each flush moves the
waiting points of a run into one record of kind ``metrics`` keyed by the run's
ref: per metric, the steps, values and times as little-endian bytes, inline
(base64) for a few thousand points or else one stored value. Readers look the
run's records up by that key and concatenate them in the order they were
logged, so a million points of one run are a few hundred records, never a
file per point.

The record also updates a *summary* (points, last value, step and time, min,
max, and a digest of the steps and values: equal digests, equal points) that
an ended run's manifest carries, so listing or comparing runs by their metrics
reads no series. A run that has not ended (live, lost, killed by SIGKILL) is
summarised from the points of the records a reader finds (:func:`read_summary`;
the ``sum`` each batch's cell carries is not trusted), so its summary always
agrees with the points :func:`read_series` returns, wherever a kill fell.

JSON has no NaN or infinity: stored summaries and every JSON casmon shows
hold them as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``
(:func:`json_number`, :func:`json_safe`); read back, they are floats again.
"""

from __future__ import annotations

import base64
import bisect
import math
import threading
import time
import warnings
from array import array
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from casmon.keys.names import keep_flat_names
from casmon.errors import DamagedObjectError
from casmon.keys.digest import Digest
from casmon.keys.fingerprint import fingerprint
from casmon.runs import sysmetrics

if TYPE_CHECKING:
    import pandas

    from casmon.store.store import Store

__all__ = ["KIND_METRICS", "INLINE_POINTS", "MAX_NAME", "Series", "Batch", "MetricLog", "metrics_key", "read_series",
           "read_summary", "downsample", "check_name", "json_number", "number_of", "json_safe", "number_text",
           "points_summary", "batch_summary", "points_cell", "live_batches", "covers_of", "covered", "MAX_COVERS",
           "NO_VALUE", "call_metrics"]

KIND_METRICS = "metrics"
#: A batch of at most this many points of one metric is kept in its record (base64); more is a stored value.
INLINE_POINTS = 2048
#: The longest metric name (MLflow allows 250).
MAX_NAME = 250
#: Names the summary in a run's ref carries (the manifest at the end carries all of them).
REF_SUMMARY_MAX = 64

#: What a batch's cell says of its points besides ``n`` (see :func:`points_summary`).
_CELL_SUM = ("last", "step", "time", "min", "max")

_STEP = np.dtype("<i8")
_F64 = np.dtype("<f8")


def metrics_key(ref: str) -> bytes:
    """The key all metric records of the run behind ``ref`` share."""
    return fingerprint(("casmon.metrics", ref))


_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def json_number(v: float) -> float | str:
    """A float as JSON holds it: itself, or ``"NaN"``, ``"Infinity"``, ``"-Infinity"``."""
    if math.isfinite(v):
        return v
    return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")


def number_of(v: Any) -> float | int | None:
    """A number written by :func:`json_number` (or a JSON number) back as a number; None for anything else."""
    if type(v) is float:
        return v
    if type(v) is int:
        return v if -(1 << 1000) < v < (1 << 1000) else None  # a crafted huge int: no float holds it
    return _NON_FINITE.get(v) if type(v) is str else None


def json_safe(v: Any) -> Any:
    """``v`` with every non-finite float in it (dicts, lists, tuples) as :func:`json_number` writes it."""
    if isinstance(v, float):  # numpy's float64 too
        return json_number(float(v))
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v


def number_text(v: Any, finite: Any = None) -> str:
    """A metric's number for people: ``NaN``, ``inf``, ``-inf`` said as such; ``finite(v)`` (default ``:.4g``)
    for the rest; "" for None."""
    if v is None or isinstance(v, bool):
        return "" if v is None else str(v)
    if type(v) is float and not math.isfinite(v):
        return "NaN" if v != v else ("inf" if v > 0 else "-inf")
    if finite is not None:
        return str(finite(v))
    return f"{v:.4g}" if type(v) is float else str(v)


def _lo(a: float, b: float) -> float:
    """The smaller of two extremes where NaN means "none yet"."""
    return b if a != a else (a if b != b else min(a, b))


def _hi(a: float, b: float) -> float:
    return b if a != a else (a if b != b else max(a, b))


def points_summary(steps: Any, values: Any, times: Any) -> dict[str, Any]:
    """``n``, ``last``, ``step``, ``time``, ``min`` and ``max`` of points (at least one): min and max over the
    values that are not NaN (infinities count), NaN when every value is NaN. Any sequences numpy reads."""
    v = np.asarray(values, np.float64)
    real = v[~np.isnan(v)]
    return {"n": len(v), "last": float(v[-1]), "step": int(steps[-1]), "time": float(times[-1]),
            "min": float(real.min()) if len(real) else math.nan, "max": float(real.max()) if len(real) else math.nan}


def points_cell(store: Store, data: bytes, n: int, refs: list[Digest],
                summary: dict[str, Any] | None = None) -> dict[str, Any]:
    """A metric's cell in a batch record for ``n`` points encoded as ``data`` (steps, values, times), with the
    batch's ``summary`` if given: inline as base64 when small, else stored as a value whose digest is appended
    to ``refs``."""
    cell: dict[str, Any] = {"n": n} if summary is None else {"n": n, "sum": summary}
    if n <= INLINE_POINTS:
        cell["b64"] = base64.b64encode(data).decode("ascii")
    else:
        d = store.put(data)
        refs.append(d)
        cell["$"] = d.hex()
    return cell


def batch_summary(steps: Any, values: Any, times: Any) -> dict[str, Any]:
    """What a batch's cell says of its points (``sum``), as stored: see :func:`read_summary`."""
    part = points_summary(steps, values, times)
    return {k: json_number(part[k]) if k != "step" else part[k] for k in _CELL_SUM}


def _merge(s: dict[str, Any] | None, part: dict[str, Any]) -> dict[str, Any]:
    """A summary with ``part`` (later points) added."""
    if s is None:
        return dict(part)
    return {"n": s["n"] + part["n"], "last": part["last"], "step": part["step"], "time": part["time"],
            "min": _lo(s["min"], part["min"]), "max": _hi(s["max"], part["max"])}


def check_name(name: object, where: str) -> str:
    if type(name) is not str:
        raise TypeError(f"{where}: a metric name must be a string, got {type(name).__name__} {name!r:.80}")
    if not name or len(name) > MAX_NAME or not name.isprintable():
        raise ValueError(f"{where}: metric name {name!r:.300} must be 1 to {MAX_NAME} printable characters")
    return name


#: ``run.log``'s second positional when none is given (``None`` is a value the call refuses, by name).
NO_VALUE: Any = type("NoValue", (), {"__repr__": lambda self: "<no value>"})()


def call_metrics(where: str, metrics: Any, value: Any, more: tuple[Any, ...],
                 named: dict[str, Any]) -> Mapping[str, Any] | None:
    """The metrics of a ``run.log`` call: a dict, or a name and its value (MLflow's ``log_metric`` shape) as
    ``{name: value}``; a wrong mix raises one line naming it. ``named`` (the keywords) is logged beside."""
    if more:
        raise TypeError(f"casmon: {where}: {2 + len(more)} positional arguments; it takes a metric name and its "
                        "value, or a dict, and the step as step=N")
    if isinstance(metrics, str):
        metrics = str(metrics)  # numpy's str_ too
        if value is NO_VALUE:
            keyword = f" or {where}({metrics}=0.5)" if metrics.isidentifier() and len(metrics) <= 80 else ""
            raise TypeError(f"casmon: {where}: metric {metrics!r:.80} has no value: {where}({metrics!r:.80}, 0.5)"
                            + keyword)
        metrics = {metrics: value}
    elif value is not NO_VALUE:
        if metrics is None:
            raise TypeError(f"casmon: {where}: a value ({_shown(value)}) with no metric name: {where}('name', value)")
        if isinstance(metrics, Mapping):
            raise TypeError(f"casmon: {where}: a dict of metrics takes no second value (got {_shown(value)}); the "
                            "step goes as step=N")
    if metrics is not None and not isinstance(metrics, Mapping):
        raise TypeError(f"casmon: {where}: metrics must be a dict of name -> number or a name and its value, "
                        f"got {type(metrics).__name__}")
    if named and metrics:
        for k in named:
            if k in metrics:
                raise TypeError(f"casmon: {where}: metric {k!r:.80} is given twice, positionally and as {k}=")
    return metrics


def _shown(v: Any) -> str:
    """A value as an error shows it: a number's digits, else its type (a repr may be huge, or raise)."""
    return f"{type(v).__name__} {_digits(v)}" if type(v) in (int, float, bool) else type(v).__name__


class Series:
    """One metric of one run: ``steps`` (int64), ``values`` (float64) and ``times`` (float64, Unix seconds)."""

    __slots__ = ("name", "steps", "values", "times")

    def __init__(self, name: str, steps: np.ndarray[Any, Any], values: np.ndarray[Any, Any],
                 times: np.ndarray[Any, Any]) -> None:
        self.name = name
        self.steps = steps
        self.values = values
        self.times = times

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def last(self) -> float | None:
        """The last value logged, or None for an empty series."""
        return float(self.values[-1]) if len(self.values) else None

    def to_pandas(self) -> pandas.DataFrame:
        """A DataFrame with columns ``step``, ``value`` and ``time`` (pandas imported only here)."""
        import pandas as pd

        return pd.DataFrame({"step": self.steps, "value": self.values,
                             "time": pd.to_datetime(self.times, unit="s", utc=True)})

    def __repr__(self) -> str:
        last = "" if not len(self) else f", last {self.values[-1]:.6g} at step {int(self.steps[-1])}"
        return f"<Series {self.name!r}: {len(self)} points{last}>"


class _Pending:
    """The points of one metric since the last flush."""

    __slots__ = ("steps", "values", "times")

    def __init__(self) -> None:
        self.steps = array("q")
        self.values = array("d")
        self.times = array("d")


class Batch:
    """Points taken for one record: ``record`` and the values it names (``refs``)."""

    __slots__ = ("record", "refs", "pending", "seq")

    def __init__(self, record: dict[str, Any], refs: list[Digest], pending: dict[str, _Pending], seq: int) -> None:
        self.record, self.refs, self.pending, self.seq = record, refs, pending, seq


class MetricLog:
    """A run's waiting points and its summary; :meth:`take` turns them into a record's fields."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.settled = threading.Condition(self.lock)  # notified when a taken batch is done or put back
        self.inflight = 0  # batches taken and neither done nor put back
        self.pending: dict[str, _Pending] = {}
        self.step = 0  # the run's own counter: the step of a point logged without one
        self.seq = 0  # records written by this log, in order
        self.summary: dict[str, dict[str, Any]] = {}
        self.last_seq: dict[str, int] = {}
        self.names: set[str] = set()
        #: A resumed run's highest flushed step per metric: points at or below it are skipped (see runs.resume).
        self.floor: dict[str, int] = {}
        self.warned: set[str] = set()
        # Digests of each metric's steps and values, fed batch by batch in order (see _hashed).
        self.hashers: dict[str, tuple[Any, Any]] = {}
        self.hash_next = 0
        self.hash_waiting: dict[int, Batch | None] = {}
        self.counted = 0  # batches the summary counts
        # What the run's ref says: the summary as of the last flush known to have written its batches (a
        # heartbeat between a batch's append and its flush's end must not name points no reader can find).
        self.written: tuple[int, dict[str, dict[str, Any]]] = (0, {})
        # Set as the run's end is stored: a point logged later (another thread) would land after the summary.
        self.sealed = False

    def log(self, metrics: Mapping[str, Any] | None, step: int | None, named: dict[str, Any], *,
            counted: bool = True) -> None:
        """Append one point per metric, all at ``step`` (default: the run's counter, then counted up).
        ``counted=False``: the run's counter stays as it is (system metrics keep steps of their own)."""
        if step is None:
            s = self.step
        else:
            try:
                s = step.__index__()
            except (AttributeError, TypeError):
                raise TypeError(f"casmon: run.log: step must be an integer, got {type(step).__name__} {step!r:.80}") from None
            if not -(1 << 63) <= s < (1 << 63):
                raise ValueError(f"casmon: run.log: step {s} does not fit in 64 bits")
            # The counter is set to the step: a call without one (casmon.log in a helper) lands on it too.
        t = time.time()
        with self.lock:
            if self.sealed:
                return  # the run has ended: its summary is taken, no point may follow it
            done: list[tuple[_Pending, int]] = []
            try:
                for items in ((metrics.items() if metrics is not None else ()), named.items()):
                    for k, v in items:
                        if self.floor and s <= self.floor.get(k, s - 1):
                            self._skipped(k, s)
                            continue
                        p = self.pending.get(k)
                        if p is None:
                            if k not in self.names:
                                check_name(k, "casmon: run.log")
                                self.names.add(k)
                            p = self.pending[k] = _Pending()
                        done.append((p, len(p.steps)))  # first: an exception at any step below is undone whole
                        if type(v) is float or type(v) is int:
                            try:
                                p.values.append(v)
                            except OverflowError:  # an int beyond any float64
                                raise _too_big(k, v) from None
                        else:
                            p.values.append(_number(k, v))
                        p.steps.append(s)
                        p.times.append(t)
            except BaseException:  # a bad value, or Ctrl-C: one call logs all its metrics or none
                for p, n0 in done:
                    del p.values[n0:]
                    del p.steps[n0:]
                    del p.times[n0:]
                raise
            if counted:
                self.step = s + 1 if step is None else s

    def _skipped(self, name: str, step: int) -> None:
        if name not in self.warned:
            self.warned.add(name)
            warnings.warn(f"casmon: run.log: metric {name!r:.80} at step {step} is skipped: the resumed run has its "
                          f"points up to step {self.floor[name]} already (said once per metric)", UserWarning,
                          stacklevel=4)

    def seal(self) -> None:
        """Take no more points: those logged so far are the run's (they may still be put back and taken again)."""
        with self.lock:
            self.sealed = True

    def has_pending(self) -> bool:
        return bool(self.pending)

    def take(self, store: Store) -> Batch | None:
        """The waiting points as a record (``None`` if there are none) and the values it names. The caller
        appends the record, then calls :meth:`done` (the summary counts it) or, if that failed,
        :meth:`put_back`. A batch too large for a record is stored first; if that fails the points stay waiting."""
        with self.lock:  # the sequence number is taken with the points: two takes at once stay in order
            pending, self.pending = self.pending, {}
            if not pending:
                return None
            seq = self.seq
            self.seq += 1
        series: dict[str, Any] = {}
        refs: list[Digest] = []
        try:
            for name, p in list(pending.items()):
                n = len(p.steps)
                if not n:  # made by a call whose value was refused
                    del pending[name]
                    continue
                data = (np.frombuffer(p.steps, np.int64).astype(_STEP, copy=False).tobytes()
                        + np.frombuffer(p.values, np.float64).astype(_F64, copy=False).tobytes()
                        + np.frombuffer(p.times, np.float64).astype(_F64, copy=False).tobytes())
                series[name] = points_cell(store, data, n, refs, batch_summary(
                    p.steps, np.frombuffer(p.values, np.float64), p.times))
        except BaseException:
            self._put_back(pending)
            self._hashed(seq, None)
            raise
        if not series:
            self._hashed(seq, None)
            return None
        with self.lock:
            self.inflight += 1
        return Batch({"seq": seq, "s": series}, refs, pending, seq)

    def _landed(self) -> None:
        with self.lock:
            self.inflight -= 1
            self.settled.notify_all()

    def wait_settled(self, timeout: float) -> bool:
        """Wait until no batch another thread took is still on its way (its summary not yet counted)."""
        with self.lock:
            return self.settled.wait_for(lambda: self.inflight <= 0, timeout)

    def done(self, batch: Batch) -> None:
        """``batch``'s record is appended: the summary counts its points."""
        with self.lock:
            for name, p in batch.pending.items():
                self._summarise(name, p, batch.seq)
            self.counted += 1
        self._hashed(batch.seq, batch)
        self._landed()

    def put_back(self, batch: Batch) -> None:
        """``batch``'s record could not be appended: its points wait again, before any logged since."""
        self._put_back(batch.pending)
        self._hashed(batch.seq, None)
        self._landed()

    def _hashed(self, seq: int, batch: Batch | None) -> None:
        """Feed the digests batches in the order of their numbers (``None``: a number whose points were put back
        or never taken), so equal points give equal digests however flushes cut them into batches."""
        with self.lock:
            self.hash_waiting[seq] = batch
            while self.hash_next in self.hash_waiting:
                b = self.hash_waiting.pop(self.hash_next)
                self.hash_next += 1
                for name, p in (b.pending.items() if b is not None else ()):
                    h = self.hashers.get(name)
                    if h is None:
                        h = self.hashers[name] = (xxhash.xxh3_128(), xxhash.xxh3_128())
                    h[0].update(np.frombuffer(p.steps, np.int64).astype(_STEP, copy=False).tobytes())
                    h[1].update(np.frombuffer(p.values, np.float64).astype(_F64, copy=False).tobytes())

    def _with_digests(self, names: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The summary as stored (non-finite numbers as :func:`json_number` writes them), digests added."""
        out = {}
        for k in names:
            cell = json_safe(self.summary[k])
            h = self.hashers.get(k)
            if h is not None:
                cell["digest"] = series_digest(h[0].digest(), h[1].digest())
            out[k] = cell
        return out

    def _put_back(self, pending: dict[str, _Pending]) -> None:
        with self.lock:
            newer, self.pending = self.pending, pending
            for k, p in newer.items():
                q = self.pending.setdefault(k, _Pending())
                q.steps.extend(p.steps)
                q.values.extend(p.values)
                q.times.extend(p.times)

    def _summarise(self, name: str, p: _Pending, seq: int) -> None:
        part = points_summary(p.steps, np.frombuffer(p.values, np.float64), p.times)
        s = self.summary.get(name)
        if s is None:
            s = self.summary[name] = {"n": 0, "min": math.nan, "max": math.nan}
        s["n"] += part["n"]
        s["min"], s["max"] = _lo(s["min"], part["min"]), _hi(s["max"], part["max"])
        if self.last_seq.get(name, -1) > seq:
            return  # a later batch was summarised first: its last point is the last
        self.last_seq[name] = seq
        s.update(last=part["last"], step=part["step"], time=part["time"])

    def snapshot(self) -> tuple[int, dict[str, dict[str, Any]]]:
        """The summary now, as a run's ref carries it (at most :data:`REF_SUMMARY_MAX` names): taken at the
        start of a flush, which writes every batch it counts; :meth:`written_up_to` once that flush ended."""
        with self.lock:
            # The user's metrics first: a GPU node's sys/ metrics must not push them out of a live run's listing.
            names = sysmetrics.users_first(self.summary)[:REF_SUMMARY_MAX]
            return self.counted, self._with_digests(sorted(names))

    def written_up_to(self, snapshot: tuple[int, dict[str, dict[str, Any]]]) -> None:
        """A flush wrote the batches ``snapshot`` counts: the ref may say so (never going back to an older one)."""
        with self.lock:
            if snapshot[0] >= self.written[0]:
                self.written = snapshot

    def ref_summary(self) -> dict[str, dict[str, Any]]:
        """The summary as a run's ref carries it: the points of written batches only."""
        with self.lock:
            return self.written[1]

    def full_summary(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            return self._with_digests(sorted(self.summary))


def series_digest(steps_digest: bytes, values_digest: bytes) -> str:
    """A metric's digest from the xxh3-128 digests of its steps and its values (each as little-endian bytes):
    equal digests, equal points."""
    return xxhash.xxh3_128(steps_digest + values_digest).hexdigest()


def _too_big(name: str, v: Any) -> ValueError:
    return ValueError(f"casmon: run.log: metric {name!r} is {type(v).__name__} {_digits(v)}, beyond any float64")


def _digits(v: Any) -> str:
    try:
        return f"{v!r:.80}"
    except ValueError:  # an int of more digits than int->str conversion allows
        return f"of about {v.bit_length() * 0.30103:.0f} digits" if type(v) is int else "(too large to show)"


def _number(name: str, v: Any) -> float:
    """A metric value as a float (numpy and torch scalars, bool), or a clear error naming the metric."""
    if isinstance(v, (str, bytes, bytearray)):
        raise TypeError(f"casmon: run.log: metric {name!r} must be a number, got {type(v).__name__} {v!r:.80}")
    try:
        item = getattr(v, "item", None)  # numpy and torch scalars (float() of a tensor needing grad warns)
        return float(item() if callable(item) else v)
    except OverflowError:
        raise _too_big(name, v) from None
    except Exception as e:  # noqa: BLE001 - whatever the value's own item() or __float__ raises
        raise TypeError(f"casmon: run.log: metric {name!r} must be a number, got {type(v).__name__} {v!r:.80} ({e})") from None


#: The most seq ranges a compacted record's ``covers`` may hold (a crafted one is damage, never a long loop).
MAX_COVERS = 1 << 16


def covers_of(r: dict[str, Any], where: str, i: int) -> list[tuple[int, int]] | None:
    """A compacted record's ``covers`` (sorted, merged inclusive seq ranges), None for a record of one batch."""
    c = r.get("covers")
    if c is None:
        return None
    if (type(c) is not list or not c or len(c) > MAX_COVERS
            or not all(type(x) is list and len(x) == 2 and type(x[0]) is int and type(x[1]) is int and x[0] <= x[1]
                       for x in c)):
        raise DamagedObjectError(f"{where}: metric record {i}", "a compacted batch whose covers are not seq ranges")
    out: list[tuple[int, int]] = []
    for lo, hi in sorted((x[0], x[1]) for x in c):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def covered(ranges: list[tuple[int, int]], seq: int) -> bool:
    """True if ``seq`` is in one of ``ranges`` (sorted, disjoint)."""
    at = bisect.bisect_right(ranges, (seq, 1 << 64)) - 1
    return at >= 0 and ranges[at][0] <= seq <= ranges[at][1]


def _overlaps(ranges: list[tuple[int, int]], lo: int, hi: int) -> bool:
    at = bisect.bisect_right(ranges, (hi, 1 << 64)) - 1
    return at >= 0 and ranges[at][1] >= lo


def live_batches(records: list[dict[str, Any]], ref: str, where: str
                 ) -> tuple[list[tuple[int, dict[str, Any]]], list[tuple[int, int]]]:
    """The records of run ``ref`` a reader uses, as ``(index, record)``, and the seqs compacted records cover.

    A compacted record (:mod:`casmon.runs.compaction`) holds the points of the batches whose seqs it
    ``covers``; until they are retired both are stored. Compacted records are taken largest first while they
    cover no seq one taken already covers, and a batch whose seq a taken one covers is skipped: whatever step
    a compaction was stopped at, each point is read exactly once."""
    mine = [(i, r) for i, r in enumerate(records) if r.get("run") == ref]  # a crafted record is checked anyway
    compacted = []
    for i, r in mine:
        c = covers_of(r, where, i)
        if c is not None:
            compacted.append((-sum(hi - lo + 1 for lo, hi in c), c[0][0], i, c))
    taken: list[tuple[int, int]] = []
    use: list[tuple[int, dict[str, Any]]] = []
    for _size, _first, i, c in sorted(compacted):
        if any(_overlaps(taken, lo, hi) for lo, hi in c):
            continue  # a smaller (older) compaction of points a larger one holds
        taken = sorted(taken + c)
        use.append((i, records[i]))
    for i, r in mine:
        if "covers" not in r and not (type(r.get("seq")) is int and covered(taken, r["seq"])):
            use.append((i, r))
    return use, taken


def _cells(store: Store, ref: str, where: str, names: Iterable[str] | None,
           records: list[dict[str, Any]] | None = None) -> dict[str, list[tuple[int, int, dict[str, Any]]]]:
    """The batch cells of the run behind ``ref`` by metric, each ``(seq, record index, cell)``, in the order logged
    (of ``records``, or of those stored)."""
    if records is None:
        table = store.table(KIND_METRICS)
        table.refresh()  # a live run's newest records
        records = store.lookup(KIND_METRICS, metrics_key(ref), refresh=False)
    wanted = set(names) if names is not None else None
    parts: dict[str, list[tuple[int, int, dict[str, Any]]]] = {}
    for i, r in live_batches(records, ref, where)[0]:
        seq, series = r.get("seq"), r.get("s")
        if type(seq) is not int or not isinstance(series, dict):
            raise DamagedObjectError(f"{where}: metric record {i}", "not {seq, s}")
        for name, cell in series.items():
            if wanted is not None and name not in wanted:
                continue
            n = cell.get("n") if isinstance(cell, dict) else None
            if type(n) is not int or n < 0:
                raise DamagedObjectError(f"{where}: metric {name!r:.80}", "a batch without its length")
            parts.setdefault(name, []).append((seq, i, cell))
    for cells in parts.values():
        cells.sort(key=lambda c: (c[0], c[1]))
    return parts


def _cell_data(store: Store, name: str, cell: dict[str, Any], where: str) -> bytes:
    from casmon.store.peek import load_data

    n = cell["n"]
    if "b64" in cell and isinstance(cell["b64"], str):
        try:
            data = base64.b64decode(cell["b64"], validate=True)
        except ValueError:
            raise DamagedObjectError(f"{where}: metric {name!r:.80}", "a batch is not base64") from None
    elif isinstance(cell.get("$"), str):
        data = bytes(load_data(store, cell["$"], f"{where}: metric {name!r:.80}", (bytes, bytearray)))
    else:
        raise DamagedObjectError(f"{where}: metric {name!r:.80}", "a batch holds no points")
    if len(data) != 24 * n:
        raise DamagedObjectError(f"{where}: metric {name!r:.80}", f"a batch of {n} points holds {len(data)} bytes")
    return data


def read_series(store: Store, ref: str, where: str, names: Iterable[str] | None = None,
                records: list[dict[str, Any]] | None = None) -> dict[str, Series]:
    """Every metric (or those in ``names``) of the run behind ``ref``, points in the order they were logged
    (from ``records``, as :meth:`Store.lookup` gave them, or read now)."""
    parts = {name: [_cell_data(store, name, c, where) for _s, _i, c in cells]
             for name, cells in _cells(store, ref, where, names, records).items()}
    out: dict[str, Series] = {}
    for name in sorted(parts):
        batches = parts[name]
        total = sum(len(d) // 24 for d in batches)
        steps = np.empty(total, np.int64)
        values = np.empty(total, np.float64)
        times = np.empty(total, np.float64)
        at = 0
        for d in batches:
            n = len(d) // 24
            steps[at : at + n] = np.frombuffer(d, _STEP, n, 0)
            values[at : at + n] = np.frombuffer(d, _F64, n, 8 * n)
            times[at : at + n] = np.frombuffer(d, _F64, n, 16 * n)
            at += n
        out[name] = Series(name, steps, values, times)
    return out


#: Summaries of stored batches (``$`` cells) by their digest: the bytes a digest names never change.
_STORED_SUMMARIES: dict[str, dict[str, Any]] = {}
_STORED_SUMMARIES_MAX = 4096
_stored_lock = threading.Lock()


def _cell_points_summary(store: Store, name: str, cell: dict[str, Any], where: str) -> dict[str, Any]:
    """The summary of a batch's points, from the points themselves: a crafted cell's ``sum`` cannot lie."""
    digest = cell.get("$") if "b64" not in cell else None
    if isinstance(digest, str):
        with _stored_lock:
            got = _STORED_SUMMARIES.get(digest)
        if got is not None and got["n"] == cell["n"]:
            return dict(got)
    d, n = _cell_data(store, name, cell, where), cell["n"]
    part = points_summary(np.frombuffer(d, _STEP, n, 0), np.frombuffer(d, _F64, n, 8 * n),
                          np.frombuffer(d, _F64, n, 16 * n))
    if isinstance(digest, str):
        with _stored_lock:
            if len(_STORED_SUMMARIES) >= _STORED_SUMMARIES_MAX:
                _STORED_SUMMARIES.pop(next(iter(_STORED_SUMMARIES)))
            _STORED_SUMMARIES[digest] = dict(part)
    return part


def read_summary(store: Store, ref: str, where: str) -> dict[str, dict[str, Any]]:
    """The summary of every metric of the run behind ``ref`` (as :meth:`MetricLog.full_summary` has it, without
    digests), from exactly the points :func:`read_series` reads. A batch's own ``sum`` is not trusted (a crafted
    one could disagree with its points): inline points are in the record already, and a stored batch's summary
    is kept per process by its digest, so a live run's summary reads each stored batch once."""
    out: dict[str, dict[str, Any]] = {}
    for name, cells in sorted(_cells(store, ref, where, None).items()):
        s: dict[str, Any] | None = None
        for _seq, _i, cell in cells:
            if cell["n"]:
                s = _merge(s, _cell_points_summary(store, name, cell, where))
        if s is not None:
            out[name] = s
    return out


def downsample(series: Series, n: int = 2000) -> dict[str, np.ndarray[Any, Any]]:
    """At most ``n`` buckets of consecutive points: ``step`` and ``time`` of each bucket's last point, ``value``
    its mean, ``min`` and ``max`` its extremes (a spike stays visible). All points when there are at most ``n``."""
    if n < 1:
        raise ValueError(f"downsample: n must be at least 1, got {n}")
    k = len(series)
    if k <= n:
        return {"step": series.steps, "time": series.times, "value": series.values, "min": series.values,
                "max": series.values}
    edges = np.linspace(0, k, n + 1).astype(np.int64)
    starts, ends = edges[:-1], edges[1:]
    v = series.values
    with np.errstate(invalid="ignore"):
        sums = np.add.reduceat(np.where(np.isfinite(v), v, 0.0), starts)
        counts = np.add.reduceat(np.isfinite(v).astype(np.int64), starts)
        mean = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        lo = np.fmin.reduceat(v, starts)
        hi = np.fmax.reduceat(v, starts)
    last = ends - 1
    return {"step": series.steps[last], "time": series.times[last], "value": mean, "min": lo, "max": hi}

# Pickles and keys name these types where they were before the packages (casmon/keys/names.py).
keep_flat_names([Series])
