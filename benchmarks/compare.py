"""casmon side by side with the tools people use today, measured in one run.

    python -m benchmarks.compare            # everything (a few minutes; needs ~3 GiB of memory)
    python -m benchmarks.compare --quick    # skips the 1 GiB rows

Installs nothing: peers (joblib, diskcache, FineCache, callmonitor) are used
when importable (`pip install -e '.[bench]'`); a row whose peer is missing says
so. Every figure comes from this run; "ratio" is casmon's figure divided by
the peer's (below 1 is better for casmon, for times and sizes alike).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
PEERS = {"joblib": "joblib", "diskcache": "diskcache", "finecache": "FineCache", "callmonitor": "callmonitor"}


def available(tool: str) -> bool:
    return tool == "casmon" or importlib.util.find_spec(PEERS[tool]) is not None


def measure(tool: str, scenario: str, *extra: str) -> dict | None:
    if not available(tool):
        return None
    d = Path(tempfile.mkdtemp(prefix=f"casmon-cmp-{tool}-"))
    try:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        p = subprocess.run([sys.executable, "-m", "benchmarks._peers", tool, scenario, str(d), *extra],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600)
        if p.returncode != 0:
            return {"error": (p.stderr.strip().splitlines() or ["failed"])[-1]}
        return json.loads(p.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(d, ignore_errors=True)


def fmt_time(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def fmt_bytes(b: float) -> str:
    return f"{b / MiB:.1f} MiB"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="skip the 1 GiB rows")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    console = Console(width=max(Console().width, 150))
    rows: list[dict] = []

    def add(what, peer, key, casmon_res, peer_res, fmt, target=""):
        row = {"what": what, "peer": peer, "target": target}
        if casmon_res is None or "error" in (casmon_res or {}):
            row["casmon"] = f"error: {casmon_res.get('error') if casmon_res else '?'}"
        else:
            row["casmon"] = fmt(casmon_res[key])
        if peer_res is None:
            row["peer_fig"] = f"{peer} not installed"
        elif "error" in peer_res:
            row["peer_fig"] = f"error: {peer_res['error'][:60]}"
        else:
            row["peer_fig"] = fmt(peer_res[key])
            if casmon_res and key in casmon_res and peer_res[key]:
                row["ratio"] = casmon_res[key] / peer_res[key]
        rows.append(row)

    with console.status("cache, small arguments"):
        small = {t: measure(t, "small") for t in ("casmon", "joblib", "diskcache", "finecache")}
    targets = {"joblib": "<= 0.1", "finecache": "< 1"}
    for peer in ("joblib", "diskcache", "finecache"):
        add("cache hit, small args", peer, "hit_s", small["casmon"], small[peer], fmt_time, targets.get(peer, ""))
    for peer in ("joblib", "diskcache", "finecache"):
        add("cache miss, small args", peer, "miss_s", small["casmon"], small[peer], fmt_time)
    for peer in ("joblib", "diskcache", "finecache"):
        add("files per 1,000 cache misses", peer, "files_per_1000", small["casmon"], small[peer], lambda n: f"{n:,}", "<= 10 files" if peer == "joblib" else "")
    sizes = [8 * MiB, 128 * MiB] + ([] if args.quick else [1024 * MiB])
    for size in sizes:
        label = f"{size // MiB} MiB" if size < 1024 * MiB else "1 GiB"
        with console.status(f"cache, {label} array argument"):
            c = measure("casmon", "array", str(size))
            j = measure("joblib", "array", str(size))
        add(f"cache hit, {label} array arg", "joblib", "hit_s", c, j, fmt_time, "<= 0.05" if size >= 1024 * MiB else "")
        add(f"cache miss, {label} array arg", "joblib", "miss_s", c, j, fmt_time)
    with console.status("200 calls returning one 16 MiB array"):
        c = measure("casmon", "same")
        j = measure("joblib", "same")
    add("bytes after 200 misses returning one 16 MiB array", "joblib", "bytes", c, j, fmt_bytes, "<= 1.05x one copy")
    add("files after 200 misses returning one 16 MiB array", "joblib", "files", c, j, lambda n: f"{n:,}")

    with console.status("call logging"):
        c = measure("casmon", "log_small")
        m = measure("callmonitor", "log_small")
    add("call log overhead per call, small args", "callmonitor", "overhead_s", c, m, fmt_time, "<= 0.1")
    add("… including the flush of those calls", "callmonitor", "overhead_flushed_s", c, m, fmt_time, "<= 0.1")
    add("files per 10,000 logged calls", "callmonitor", "files_per_10000", c, m, lambda n: f"{n:,}", "<= 20 files")
    with console.status("200 logged calls with one 16 MiB array"):
        c = measure("casmon", "log_same")
        m = measure("callmonitor", "log_same")
    add("bytes after 200 logged calls with one 16 MiB array", "callmonitor", "bytes", c, m, fmt_bytes, "<= 1.05x one copy")
    add("files after 200 logged calls with one 16 MiB array", "callmonitor", "files", c, m, lambda n: f"{n:,}")

    t = Table(title=f"casmon vs peers — Python {platform.python_version()}, {os.cpu_count()} cores, {platform.machine()}")
    for col in ("measure", "peer", "casmon", "peer's figure", "ratio", "target"):
        t.add_column(col)
    for r in rows:
        ratio = r.get("ratio")
        t.add_row(r["what"], r["peer"], r["casmon"], r["peer_fig"], "" if ratio is None else f"{ratio:.3g}x", r["target"])
    console.print(t)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
