"""``casmon ui`` on a big store: the runs page of 10,000 runs (and a million logged calls) over HTTP.

    python -m benchmarks.ui_bench                       # 10,000 runs, 1,000,000 calls (builds for a minute or two)
    python -m benchmarks.ui_bench --runs 1000 --calls 0 # quick
    python -m benchmarks.ui_bench --keep /tmp/big       # build once, measure again later (reused if it exists)

The store is built the way ``casmon.record`` writes runs (a manifest value, a
``run`` record, a ref) but with one flush for all of them (recording 10,000
runs one by one takes half an hour of flushing), plus calls of an intercepted
function in one session. Then a server is started in this process on
127.0.0.1 (port 0) and timed through ``http.client``, whole responses:

* **first runs page** -- a fresh server's first ``GET /``: the index listed from
  the run records and ``refs/runs``, the 50 manifests of the page read;
* **runs page** -- ``GET /`` again, and page 100 (median of ``--repeat``);
* **sort by info.loss** -- the first time (every manifest read; the background
  indexer may have read some already), then again (median);
* **filter loss<0.001** -- median, after the sort;
* **compare 2 runs**, **calls page** (the call log read: a million calls) --
  the first time.

Goal (issue 16): the runs page renders in under a second.
"""

from __future__ import annotations

import argparse
import http.client
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def step(i, scale=2):
    """The logged function: trivial, so building a million calls is the call log's own cost."""
    return i * scale


def build(path: Path, runs: int, calls: int) -> None:
    import casmon
    from casmon.keys.fingerprint import fingerprint
    from casmon.runs import KIND_RUN, RUN_REFS

    s = casmon.open(path, autoflush=None)
    t0 = time.perf_counter()
    packages = s.put({"numpy": "2.0", "zarr": "3.1"})
    written = []
    for i in range(runs):
        start = 1.7e9 + 60 * i
        m = {"casmon_run": 1, "name": f"{i + 1}-sweep", "n": i + 1, "prefix": "", "comment": "sweep", "status": "ok",
             "function": None, "start": start, "end": start + 30, "duration": 30.0,
             "git": {"root": "/project", "in_git": True, "commit": f"{i // 100:040x}", "branch": "main", "dirty": False,
                     "untracked": [], "skipped": [], "notes": [], "patch": None},
             "files": {}, "host": "host", "user": "user", "pid": 1, "python": "3.11", "argv": ["train.py"],
             "packages": packages.hex(), "env": {},
             "info": {"loss": 1.0 / (i + 1), "lr": 0.001 * (i % 10), "epochs": i % 7, "acc": (i % 100) / 100,
                      "optimizer": ["adam", "sgd"][i % 2], "curve": [1.0 / (j + 1 + i % 5) for j in range(20)]},
             "links": {"call_sessions": [], "cache": []}}
        d = s.put(m)
        ref = f"{RUN_REFS}/{i + 1}"
        s.append(KIND_RUN, {"name": m["name"], "manifest": d.hex(), "status": "ok", "time": start, "_ref": ref,
                            "_ref_target": d.hex()}, key=fingerprint(("casmon.run", ref)), refs=[d, packages])
        written.append((ref, d, m))
    s.flush()
    for ref, d, m in written:
        s.set_ref(ref, d, {"name": m["name"], "status": "ok", "start": m["start"]})
    print(f"  {runs:,} runs written in {time.perf_counter() - t0:.1f} s", flush=True)
    if calls:
        t0 = time.perf_counter()
        logged = casmon.intercept(store=s)(step)
        for i in range(calls):
            logged(i)
        s.flush()
        casmon.flush()
        print(f"  {calls:,} calls logged in {time.perf_counter() - t0:.1f} s", flush=True)
    s.close()


def timed(port: int, path: str) -> tuple[float, int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("GET", path)
    r = conn.getresponse()
    body = r.read()
    dt = time.perf_counter() - t0
    conn.close()
    if r.status != 200:
        raise SystemExit(f"GET {path}: {r.status}\n{body[:2000].decode(errors='replace')}")
    return dt, len(body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--keep", type=Path, default=None, help="build the store here (reused if it exists) and keep it")
    args = ap.parse_args()

    import casmon
    from casmon.ui.server import make_server

    tmp = None
    path = args.keep
    if path is None:
        tmp = Path(tempfile.mkdtemp(prefix="casmon-ui-bench-"))
        path = tmp / "store"
    try:
        built = not (path / "casmon.json").exists()
        if built:
            print(f"building {path}: {args.runs:,} runs, {args.calls:,} calls", flush=True)
            build(path, args.runs, args.calls)
        store = casmon.open(path, read_only=True, trust=False, create=False, autoflush=None)
        server = make_server(store, "127.0.0.1", 0)
        port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        rows = []

        def one(label: str, url: str) -> None:
            dt, n = timed(port, url)
            rows.append((label, dt, n))
            print(f"  {label:<34} {dt * 1000:9.1f} ms  {n / 1024:8.1f} KiB", flush=True)

        def median(label: str, url: str) -> None:
            times = []
            for _ in range(args.repeat):
                dt, n = timed(port, url)
                times.append(dt)
            rows.append((label, statistics.median(times), n))
            print(f"  {label:<34} {statistics.median(times) * 1000:9.1f} ms  {n / 1024:8.1f} KiB (median of {args.repeat})",
                  flush=True)

        print(f"runs page of {args.runs:,} runs ({args.calls:,} calls in the store):" if built
              else f"the store at {path}, built earlier:")
        one("first runs page (fresh server)", "/")
        median("runs page", "/")
        median("runs page 100", "/?page=100")
        one("sort by info.loss, first time", "/?sort=info.loss&order=asc")
        median("sort by info.loss", "/?sort=info.loss&order=asc")
        median("filter loss<0.001", "/?q=loss%3C0.001")
        one("compare 2 runs", f"/compare?run=1&run={args.runs}")
        if args.calls:  # --calls 0 skips the calls page
            one("calls page, first time", "/calls")
            median("calls page", "/calls")
        server.shutdown()
        server.close()
        store.close()
        goal = max(dt for label, dt, _ in rows if label in ("first runs page (fresh server)", "runs page", "runs page 100"))
        print(f"goal: runs page < 1 s: {'met' if goal < 1 else 'NOT met'} (slowest {goal * 1000:.0f} ms)")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
