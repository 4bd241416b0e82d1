"""The runs page's parallel coordinates: the shown runs' parameters against a metric, drawn by the browser.

The server writes what to draw as a JSON block (``casmon-parcoords-data``):
each run of the table's page with its link, its scalar parameters (flattened:
``cfg.lr``) and its metrics' last, min and max (from the run's summary; no
series is read). ``static/casmon-parcoords.js`` draws one SVG line per run
across an axis per parameter (numeric or categorical) and the chosen metric,
and filters the lines by brushing an axis.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from casmon.view.display import Html
from casmon.ui.model import is_scalar
from casmon.ui.values import json_block

#: Parameters offered as axes at most (those whose values differ across the runs first, then those most runs have).
MAX_AXES = 40


def _run(e: Any, r: Any) -> dict[str, Any]:
    try:
        params = {k: v for k, v in r.flat_params().items() if is_scalar(v) and v is not None}
    except Exception:  # noqa: BLE001 - a crafted manifest: no parameters, the run is still a line
        params = {}
    try:
        summary = r.metric_summary()
    except Exception:  # noqa: BLE001 - as above: no metrics
        summary = {}
    metrics = {name: {k: s.get(k) for k in ("last", "min", "max")} for name, s in summary.items() if isinstance(s, dict)}
    return {"tail": e.tail, "name": r.name, "status": r.status, "href": "/run/" + quote(e.tail, safe=""), "params": params,
            "metrics": metrics}


def parcoords_section(rows: list[tuple[Any, Any, Any]]) -> Html:
    """The section and its data block for the runs ``rows`` shows (``(entry, run, row)``, the table's order);
    nothing when no run has a parameter or a metric to draw."""
    runs = [_run(e, r) for e, r, _row in rows]
    if len(runs) < 2 or not any(x["params"] for x in runs) or not any(x["metrics"] for x in runs):
        return Html("")
    # the parameters most runs have first: one run's many (a framework's whole config) must not crowd them out
    have = {k: sum(k in x["params"] for x in runs) for x in runs for k in x["params"]}
    keys = sorted(have, key=lambda k: (-have[k], k))
    varying = [k for k in keys if len({repr(x["params"].get(k)) for x in runs}) > 1]
    axes = (varying + [k for k in keys if k not in varying])[:MAX_AXES]
    metrics = sorted({m for x in runs for m in x["metrics"]})
    default = "loss" if "loss" in metrics else next((m for m in metrics if m.endswith("loss")), metrics[0])
    data = {"runs": runs, "params": axes, "varying": [k for k in varying if k in axes], "metrics": metrics,
            "default": default}
    return Html('<details class="parcoords-box" id="parcoords-box" open><summary>Parallel coordinates '
                '<span class="muted">(the runs on this page: parameters against a metric; drag along an axis to '
                'filter, click a line to open its run)</span></summary><div id="parcoords"><noscript><p class="muted">'
                "The chart needs JavaScript.</p></noscript></div></details>" + str(json_block("casmon-parcoords-data", data)))
