"""``search_runs`` for :mod:`casmon.compat.mlflow`: casmon runs as MLflow's rows, its filter, order and DataFrame.

A filter is MLflow's: comparisons joined by ``AND``, each ``metrics.x``, ``params.x``, ``tags.x`` or an
attribute (``attributes.status``, ``run_id``, ``run_name``, ``start_time``, ``end_time``; keys with spaces
in backticks or quotes) against a quoted string or a number, with ``=``, ``!=``, ``<``, ``<=``, ``>``,
``>=``, ``LIKE``, ``ILIKE`` (``%`` and ``_`` wildcards) or ``IN ('a', 'b')``.
"""

from __future__ import annotations

import math
import re
from typing import Any

from casmon.errors import CasmonError

__all__ = ["row", "where", "ordered", "frame", "BASE_COLUMNS"]

BASE_COLUMNS = ("run_id", "experiment_id", "status", "artifact_uri", "start_time", "end_time")
_ATTRIBUTES = {"status", "run_id", "run_name", "start_time", "end_time", "experiment_id", "artifact_uri", "user_id"}


def _err(msg: str) -> CasmonError:
    return CasmonError(f"casmon.compat.mlflow: search_runs: {msg}")


def row(r: Any, statuses: dict[str, str], artifact_uri: str) -> dict[str, Any]:
    """Run ``r`` (a RunInfo) as MLflow's row: attributes, ``metrics.*`` (last values), ``params.*`` (as text),
    ``tags.*`` (its MLflow tags, and ``mlflow.runName``, ``mlflow.user``, ``mlflow.parentRunId``)."""
    m = r.manifest
    run_id = r.ref.split("/", 1)[-1]
    out: dict[str, Any] = {"run_id": run_id, "experiment_id": (m.get("prefix") or "").rstrip("-") or "0",
                           "status": statuses.get(r.status, str(r.status).upper()), "artifact_uri": artifact_uri,
                           "start_time": m.get("start"), "end_time": m.get("end"), "run_name": m.get("comment") or r.name,
                           "user_id": m.get("user")}
    if r.error is not None:
        return out
    for k, v in r.metric_summary().items():
        out[f"metrics.{k}"] = v.get("last")
    for k, v in r.flat_params().items():
        out[f"params.{k}"] = v if isinstance(v, str) else str(v)
    info = r.manifest.get("info") or {}
    kept = info.get("mlflow_tags")
    tags = {str(k): str(v) for k, v in kept.items()} if isinstance(kept, dict) else {}
    tags.setdefault("mlflow.runName", str(m.get("comment") or r.name))
    if m.get("user"):
        tags.setdefault("mlflow.user", str(m["user"]))
    if isinstance(m.get("parent"), str):
        tags.setdefault("mlflow.parentRunId", m["parent"].split("/", 1)[-1])
    for k, v in tags.items():
        out[f"tags.{k}"] = v
    return out


_CLAUSE = re.compile(
    r"""\s*(?P<key>(?:(?:metrics?|params?|parameters?|tags?|attributes?|attr|run)\.)?(?:`[^`]+`|"[^"]+"|[\w.]+))\s*
        (?P<op>!=|>=|<=|=|<|>|\bNOT\s+ILIKE\b|\bNOT\s+LIKE\b|\bILIKE\b|\bLIKE\b|\bNOT\s+IN\b|\bIN\b)\s*
        (?P<value>'(?:[^']|'')*'|"(?:[^"]|"")*"|\((?:[^)]*)\)|[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+|[-+]?[\w.]+)\s*(?:\bAND\b|$)""",
    re.I | re.X)
_GROUPS = {"metric": "metrics", "metrics": "metrics", "param": "params", "params": "params", "parameter": "params",
           "parameters": "params", "tag": "tags", "tags": "tags", "attribute": "", "attributes": "", "attr": "",
           "run": ""}


def _parse(filter_string: str) -> list[tuple[str, str, Any]]:
    clauses = []
    pos, text = 0, filter_string.strip()
    while pos < len(text):
        m = _CLAUSE.match(text, pos)
        if m is None or m.end() == pos:
            raise _err(f"cannot read the filter at {text[pos:pos + 60]!r} (MLflow's grammar: "
                       f"metrics.x > 0.5 AND params.y = 'a' AND tags.z = 'b')")
        clauses.append((_column(m["key"]), " ".join(m["op"].upper().split()), _value(m["value"])))
        pos = m.end()
    return clauses


def _unquote(s: str) -> str:
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "`\"'":
        return s[1:-1].replace(s[0] * 2, s[0])
    return s


def _column(key: str) -> str:
    head, dot, rest = key.partition(".")
    if dot and head.lower() in _GROUPS and not key.startswith(("`", '"')):
        group = _GROUPS[head.lower()]
        name = _unquote(rest)
        if not group:
            if name not in _ATTRIBUTES:
                raise _err(f"unknown attribute {name!r}; attributes: {', '.join(sorted(_ATTRIBUTES))}")
            return name
        return f"{group}.{name}"
    name = _unquote(key)
    if name in _ATTRIBUTES:
        return name
    raise _err(f"{name!r} is not metrics.X, params.X, tags.X or an attribute ({', '.join(sorted(_ATTRIBUTES))})")


def _value(text: str) -> Any:
    if text.startswith("("):
        return [_value(x.strip()) for x in re.findall(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|[^,\s]+", text[1:-1])]
    if text[0] in "'\"":
        return _unquote(text)
    try:
        return float(text)
    except ValueError:
        raise _err(f"{text!r:.60} is neither a quoted string nor a number") from None


def _like(pattern: str, flags: int) -> re.Pattern[str]:
    return re.compile("".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern) + r"\Z",
                      flags | re.S)


def _holds(v: Any, op: str, want: Any, col: str) -> bool:
    if v is None:
        return False  # a NaN compares as MLflow's: unequal to every number, neither above nor below one
    if col in ("start_time", "end_time"):
        v = v * 1000  # MLflow compares its times in milliseconds
    if op in ("IN", "NOT IN"):
        return (str(v) in {str(w) for w in want}) == (op == "IN")
    if op in ("LIKE", "ILIKE", "NOT LIKE", "NOT ILIKE"):
        hit = _like(str(want), re.I if "ILIKE" in op else 0).match(str(v)) is not None
        return hit != op.startswith("NOT")
    if isinstance(want, float):
        try:
            v = float(v)
        except (TypeError, ValueError):
            return False
    else:
        v = str(v)
    try:
        return {"=": v == want, "!=": v != want, "<": v < want, "<=": v <= want, ">": v > want, ">=": v >= want}[op]
    except TypeError:
        return False


def where(rows: list[dict[str, Any]], filter_string: str | None) -> list[dict[str, Any]]:
    if not filter_string or not filter_string.strip():
        return rows
    clauses = _parse(filter_string)
    return [r for r in rows if all(_holds(r.get(c), op, w, c) for c, op, w in clauses)]


def ordered(rows: list[dict[str, Any]], order_by: list[str] | None) -> list[dict[str, Any]]:
    """Newest first (MLflow's default), then by each ``order_by`` key (``metrics.x DESC``); NaN after every
    number either way, and runs without the key last."""
    out = sorted(rows, key=lambda r: (-(r.get("start_time") or 0.0), r["run_id"]))
    for spec in reversed(order_by or []):
        parts = spec.strip().rsplit(None, 1)
        desc = len(parts) == 2 and parts[1].upper() == "DESC"
        key = parts[0] if len(parts) == 2 and parts[1].upper() in ("ASC", "DESC") else spec.strip()
        col = _column(key)
        have = [r for r in out if r.get(col) is not None and not _is_nan(r[col])]
        nan = [r for r in out if r.get(col) is not None and _is_nan(r[col])]  # after every number, as MLflow's
        lacking = [r for r in out if r.get(col) is None]
        try:
            have.sort(key=lambda r: r[col], reverse=desc)
        except TypeError:
            have.sort(key=lambda r: str(r[col]), reverse=desc)
        out = have + nan + lacking
    return out


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def frame(rows: list[dict[str, Any]]) -> Any:
    """MLflow's DataFrame: the base columns, then ``metrics.*``, ``params.*``, ``tags.*`` in first-seen order;
    times as UTC datetimes."""
    import pandas as pd

    names: dict[str, None] = {}
    for group in ("metrics.", "params.", "tags."):
        for r in rows:
            for k in r:
                if k.startswith(group):
                    names[k] = None
    cols = [*BASE_COLUMNS, *names]
    df = pd.DataFrame([{c: r.get(c) for c in cols} for r in rows], columns=cols)
    for c in ("start_time", "end_time"):
        df[c] = pd.to_datetime(df[c].astype("float64"), unit="s", utc=True)
    for c in names:
        if c.startswith("metrics."):
            df[c] = df[c].astype("float64")
    return df
