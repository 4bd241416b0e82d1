"""What charts draw, as JSON: logged metrics downsampled, info sequences, and the chart block of a page.

A logged metric goes to the browser through :func:`metric_json`: at most ``n``
buckets (about a chart's width in pixels), each its mean with its min and max
(the envelope the chart draws as a band), the first and last points their own
buckets, so a run of a million points sends a few hundred and its chart page
loads in well under a second; a zoomed chart asks for the steps in view
again, at full resolution where they fit. Info values that are sequences of numbers
(a JSON list, or a stored 1-D numeric array, read without unpickling) of at
least :data:`SEQUENCE_MIN` elements are curves too, over their index; shorter
ones (eight weights) are values, shown as a summary and a sparkline.

The chart block (:func:`chart_spec`) names the runs, their parameters, their
metric summaries and the metrics grouped for the dashboard (:func:`metric_groups`:
``train/*``, ``val/*``, ..., the ungrouped, the sampled ``sys/*`` last); the server's pages let
the script fetch points from ``/api/run/NAME/metrics``, a report file carries them inline.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np

from casmon.errors import CasmonError
from casmon.runs import RunInfo, flatten
from casmon.store.peek import as_digest, peek
from casmon.ui.model import is_number, is_scalar
from casmon.ui.values import numbers_of

#: An info sequence shorter than this is a value (a summary and a sparkline), not a curve.
SEQUENCE_MIN = 32
#: A stored array larger than this is not read for a chart or a sparkline.
SEQUENCE_MAX_BYTES = 64 << 20
#: Buckets a chart asks for by default, and the most it may ask for.
POINTS = 2000
MAX_POINTS = 20_000
#: Buckets per series a report file carries inline (a file of 10 runs x 5 metrics stays a few MiB).
REPORT_POINTS = 1000
#: Metric groups a dashboard shows first, in this order; other prefixes follow by name, then the metrics without a
#: prefix, then info curves, then ``sys`` (sampled, not logged: a GPU node's dozens never stand before ``loss``).
GROUP_ORDER = ("train", "val", "valid", "validation", "test", "eval")
#: The group of metrics without a prefix (``loss``), and of info sequences drawn as curves.
UNGROUPED, INFO_GROUP = "", "info"


def group_of(name: str) -> str:
    """A metric's dashboard group: its prefix before the first ``/`` (``train/loss``: ``train``), ``info`` for an
    info curve (``info:curve``), ``""`` for none."""
    if name.startswith("info:"):
        return INFO_GROUP
    head, sep, rest = name.partition("/")
    return head if sep and head and rest else UNGROUPED


def metric_groups(names: list[str]) -> list[dict[str, Any]]:
    """``[{"group": "train", "metrics": [...]}, ...]``: every name once, in its group, groups in dashboard order
    (train, val, test ..., other prefixes by name, the ungrouped, info curves, sys); names sorted in a group."""
    groups: dict[str, list[str]] = {}
    for name in sorted(set(names)):
        groups.setdefault(group_of(name), []).append(name)

    def rank(g: str) -> tuple[int, int, str]:
        if g in GROUP_ORDER:
            return (0, GROUP_ORDER.index(g), g)
        return (1 if g not in (UNGROUPED, INFO_GROUP, "sys") else 2 + (UNGROUPED, INFO_GROUP, "sys").index(g), 0, g)

    return [{"group": g, "metrics": groups[g]} for g in sorted(groups, key=rank)]


def _list(a: np.ndarray[Any, Any]) -> list[Any]:
    """Floats for a chart's line and band: NaN and infinities (which no axis can hold) are gaps, null; the
    chart marks them from ``marks``."""
    a = np.asarray(a, dtype=np.float64)
    if np.isfinite(a).all():
        return list(a.tolist())
    return [x if math.isfinite(x) else None for x in a.tolist()]


def _packed(a: np.ndarray[Any, Any]) -> str:
    """Floats as the browser decodes them fastest: little-endian float64, base64; NaN and infinities are NaN,
    which the script makes gaps (null), as :func:`_list` does. JSON text of a float costs ~1 us to write and
    ~18 bytes; this ~0.01 us and 10.7 bytes."""
    a = np.asarray(a, dtype=np.float64)
    if not np.isfinite(a).all():
        a = np.where(np.isfinite(a), a, np.nan)
    return base64.b64encode(a.astype("<f8", copy=False).tobytes()).decode("ascii")


def chart_buckets(steps: np.ndarray[Any, Any], n: int) -> tuple[Any, Any, Any, int | None] | None:
    """How a chart of a run's points (``steps``, in the order logged) shows them in at most ``n`` buckets: None
    when they all fit; else ``(order, starts, xs, every)``: the points taken in ``order`` (None: as logged),
    bucket ``i`` is those from ``starts[i]`` to the next start, drawn at step ``xs[i]``.

    The first and the last point are buckets of their own, at their own steps (a chart starts and ends where
    the run did). The others fall in buckets of ``every`` steps (a power of two: [0, every), [every, 2 every),
    ...), drawn at the bucket's first step: runs of different lengths and step ranges share their x values,
    so a chart of 100 of them joins a few hundred xs, not 100 times as many. From 4 buckets up; below, and for
    steps spread wider than 2**62, ``n`` runs of consecutive points (``every`` None; from 3 up the first and the
    last alone), drawn at their last step."""
    k = len(steps)
    if k <= n:
        return None
    mid = steps[1 : k - 1]
    span = int(mid.max()) - int(mid.min()) if len(mid) else 0
    every = 1 if span <= n - 3 else 1 << (-(-span // max(n - 3, 1)) - 1).bit_length()  # least power of 2 >= span/(n-3)
    if n < 4 or every > 1 << 62:
        edges = (np.linspace(0, k, n + 1) if n < 3 else np.concatenate(([0], np.linspace(1, k - 1, n - 1), [k])))
        edges = edges.astype(np.int64)
        return None, edges[:-1], steps[edges[1:] - 1], None
    keys = mid // every
    order = None
    if len(keys) > 1 and not bool((keys[1:] >= keys[:-1]).all()):  # steps not logged in order: sorted into buckets
        sort = np.argsort(keys, kind="stable")
        keys = keys[sort]
        order = np.concatenate(([0], sort + 1, [k - 1]))
    inner = np.concatenate(([0], np.flatnonzero(keys[1:] != keys[:-1]) + 1)) if len(keys) else np.zeros(0, np.int64)
    starts = np.concatenate(([0], inner + 1, [k - 1]))
    xs = np.concatenate((steps[:1], keys[inner] * every, steps[k - 1 :]))
    return order, starts, xs, every


def _marks(values: np.ndarray[Any, Any], starts: np.ndarray[Any, Any] | None) -> dict[str, list[int]]:
    """Which points (or buckets, each starting at ``starts``) hold a NaN, +inf or -inf: ``{"NaN": [i, ...],
    "Infinity": [...], "-Infinity": [...]}``, only the kinds there are."""
    out: dict[str, list[int]] = {}
    for kind, hit in (("NaN", np.isnan(values)), ("Infinity", values == np.inf), ("-Infinity", values == -np.inf)):
        if not hit.any():
            continue
        idx = np.flatnonzero(hit) if starts is None else np.flatnonzero(np.add.reduceat(hit.astype(np.int64), starts))
        out[kind] = idx.tolist()
    return out


def _finite_extremes(v: np.ndarray[Any, Any], starts: np.ndarray[Any, Any]) -> tuple[Any, Any]:
    """Each bucket's min and max over its finite values (NaN where it has none): the band a chart draws."""
    finite = np.isfinite(v)
    with np.errstate(invalid="ignore"):
        lo = np.fmin.reduceat(np.where(finite, v, np.inf), starts)
        hi = np.fmax.reduceat(np.where(finite, v, -np.inf), starts)
    lo[~np.isfinite(lo)] = np.nan
    hi[~np.isfinite(hi)] = np.nan
    return lo, hi


def metric_json(tail: str, name: str, series: Any, n: int = POINTS, packed: bool = False,
                steps: tuple[int, int] | None = None) -> dict[str, Any]:
    """One run's metric for a chart: ``step``, ``time``, ``value`` (bucket means over finite values) and, when
    downsampled (:func:`chart_buckets`: ``step`` is where a bucket is drawn, ``every`` its width in steps),
    ``min`` and ``max`` (over each bucket's finite values: every extreme is an edge of the band); the first and
    last points are their own buckets; ``time`` is that of a bucket's last point. ``n`` is the number of points
    logged; ``marks`` the points or buckets holding NaN or an infinity (the chart marks them).

    ``steps``: only the points from ``steps[0]`` to ``steps[1]`` (a zoomed chart: the points in view, at up to
    ``n`` buckets again), ``n`` then counting those. ``packed``: each list as :func:`_packed` writes it
    (``"enc": "f64"``), for the page's script."""
    st, vs, ts = np.asarray(series.steps), np.asarray(series.values, np.float64), np.asarray(series.times, np.float64)
    if steps is not None:
        keep = (st >= steps[0]) & (st <= steps[1])
        st, vs, ts = st[keep], vs[keep], ts[keep]
    k = len(st)
    buckets = chart_buckets(st, n)
    out: dict[str, Any] = {"run": tail, "name": name, "n": k}
    cols: dict[str, Any]
    if buckets is None:
        cols = {"step": st, "time": ts, "value": vs}
        starts = None
    else:
        order, starts, xs, every = buckets
        if order is not None:
            vs, ts = vs[order], ts[order]
        last = np.append(starts[1:], k) - 1
        finite = np.isfinite(vs)
        with np.errstate(invalid="ignore", divide="ignore"):
            sums = np.add.reduceat(np.where(finite, vs, 0.0), starts)
            counts = np.add.reduceat(finite.astype(np.int64), starts)
            mean = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        lo, hi = _finite_extremes(vs, starts)
        cols = {"step": xs, "time": ts[last], "value": mean, "min": lo, "max": hi}
        if every is not None:
            out["every"] = every
    if packed:
        out["enc"] = "f64"
        out.update({c: _packed(a) for c, a in cols.items()})
    else:
        out.update({c: (a.astype(np.int64).tolist() if c == "step" else _list(a)) for c, a in cols.items()})
    marks = _marks(vs, starts)
    if marks:
        out["marks"] = marks
    return out


def sequence_json(tail: str, name: str, xs: list[float], n: int = POINTS) -> dict[str, Any]:
    """An info sequence for a chart: x is the index (it has no steps), downsampled like a metric."""
    k = len(xs)
    if k <= n:
        return {"run": tail, "name": name, "n": k, "step": list(range(k)), "time": None, "value": _list(np.array(xs))}
    v = np.asarray(xs, dtype=np.float64)
    edges = np.linspace(0, k, n + 1).astype(np.int64)
    starts = edges[:-1]
    with np.errstate(invalid="ignore"):
        mean = np.add.reduceat(v, starts) / np.diff(edges)
        lo, hi = np.fmin.reduceat(v, starts), np.fmax.reduceat(v, starts)
    return {"run": tail, "name": name, "n": k, "step": (edges[1:] - 1).tolist(), "time": None, "value": _list(mean),
            "min": _list(lo), "max": _list(hi)}


def sequence_of(store: Any, v: Any, trust: bool, minimum: int = 2) -> list[float] | None:
    """The numbers of an info value that is a sequence: a JSON list of numbers, or a stored 1-D numeric array
    (read without unpickling); None for anything else."""
    if isinstance(v, list):
        nums = numbers_of(v)
        return nums if nums is not None and len(nums) >= minimum else None
    if isinstance(v, dict) and set(v) == {"$"}:
        try:
            m = store.manifest(as_digest(v["$"], "run info"))
            if m.tag != "array" or len(m.meta.get("shape", ())) != 1 or m.nbytes > SEQUENCE_MAX_BYTES:
                return None
            arr = peek(store, v["$"], trust=trust)
        except (CasmonError, ValueError, TypeError):
            return None
        if not isinstance(arr, np.ndarray) or arr.ndim != 1 or arr.dtype.kind not in "iuf" or arr.size < minimum:
            return None
        return [float(x) for x in arr.astype(np.float64)]
    return None


def flat_info(r: RunInfo) -> dict[str, Any]:
    """The run's info, nested dicts flattened (``cfg.lr``); values as stored (JSON, or ``{"$": digest}``)."""
    info = r.manifest.get("info")
    return flatten(info) if isinstance(info, dict) else {}


def chart_params(r: RunInfo) -> dict[str, Any]:
    """What a chart can group or plot runs by: the parameters (flattened) and the info scalars (``info.KEY``)."""
    out: dict[str, Any] = {}
    try:
        params = r.flat_params()
    except Exception:  # noqa: BLE001 - a crafted manifest: no parameters
        params = {}
    for k, v in params.items():
        if is_scalar(v) and v is not None:
            out[k] = v
    for k, v in flat_info(r).items():
        if is_scalar(v) and v is not None:
            out[f"info.{k}"] = v
    return out


#: Points read together at most (24 bytes each): a request for many long metrics holds a bounded part at once.
TOGETHER_POINTS = 4_000_000


def read_together(r: RunInfo, names: list[str], summary: dict[str, Any]) -> dict[str, Any]:
    """The series of ``names`` the run logged, read in one pass over its records (a long sampled run has one per
    flush: thousands), or ``{}`` where each is better read alone (one name, long series, a damaged one)."""
    if len(names) < 2:
        return {}
    try:
        sizes = [int(summary.get(m, {}).get("n") or 0) for m in names]
    except (TypeError, ValueError, OverflowError):  # a crafted summary: read each alone
        return {}
    if sum(sizes) > TOGETHER_POINTS:
        return {}  # long series: one at a time, each downsampled before the next is read
    try:
        return r.metrics(names)
    except CasmonError:  # one damaged series: each is read alone, so only its panel says so
        return {}


def chart_spec(mode: str, runs: list[RunInfo], tails: list[str], *, api: bool, store: Any = None, trust: bool = False,
               inline_points: int = 0) -> dict[str, Any]:
    """The chart block of a run page (``mode="run"``) or a compare page (``"compare"``).

    ``api``: the script fetches logged points from ``/api/metric``; otherwise (``inline_points``, a report
    file) they are read here and carried in the block."""
    specs: list[dict[str, Any]] = []
    metrics: set[str] = set()
    seq_names: list[str] = []
    series: dict[str, dict[str, Any]] = {}
    for r, tail in zip(runs, tails):
        summary = r.metric_summary()
        metrics.update(summary)
        params = chart_params(r)
        info_nums = {k[5:]: v for k, v in params.items() if k.startswith("info.") and is_number(v)}
        specs.append({"tail": tail, "name": r.name, "status": r.status,
                      "start": r.manifest.get("start") if is_number(r.manifest.get("start")) else None,
                      "params": params, "summary": summary,
                      "info": info_nums})
        for k, v in flat_info(r).items():
            xs = sequence_of(store or r.store, v, trust, SEQUENCE_MIN)
            if xs is not None:
                key = f"info:{k}"
                if key not in seq_names:
                    seq_names.append(key)
                series.setdefault(key, {})[tail] = sequence_json(tail, k, xs, inline_points or POINTS)
    logged = sorted(metrics)
    if inline_points:
        for r, spec, tail in zip(runs, specs, tails):
            read = read_together(r, [m for m in logged if m in spec["summary"]], spec["summary"])
            for name in logged:
                try:
                    s = read[name] if name in read else r.metric(name)
                except (LookupError, CasmonError):
                    continue
                series.setdefault(name, {})[tail] = metric_json(tail, name, s, inline_points)
    all_params: list[dict[str, Any]] = [s["params"] for s in specs]
    # Runs are grouped and scattered by what they were given (parameters), never by what they produced
    # (info such as final_acc): those are the scatter's y values.
    keys = sorted({k for p in all_params for k in p if not k.startswith("info.")})
    groupable = []
    for k in keys:
        values = {repr(p.get(k)) for p in all_params}
        if 1 < len(values) < len(specs):  # groups of two or more runs somewhere
            groupable.append(k)
    scalars = sorted({f"info:{k[5:]}" for p in all_params for k, v in p.items() if k.startswith("info.") and is_number(v)})
    default = "loss" if "loss" in metrics else (logged[0] if logged else (seq_names[0] if seq_names else ""))
    return {"mode": mode, "api": "/api/run/" if api else None, "runs": specs, "metrics": logged + seq_names,
            "groups": metric_groups(logged + seq_names),
            "default": default, "params": keys, "groupable": groupable, "scalars": scalars, "series": series,
            "times": True}
