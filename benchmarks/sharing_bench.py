"""Many writers, one store: processes caching small results at once, on a local folder and on S3.

    python -m benchmarks.sharing_bench [--procs 8] [--calls 1000]

S3 is moto's server on 127.0.0.1 (started here; needs `pip install -e '.[test]'`).
Reports entries written and lost, throughput beside a single process, and S3
requests per cached call.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent

WORKER = r"""
import json, sys, time, casmon
loc, w, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = casmon.open(loc)

@casmon.cache(store=store)
def result(worker, i):
    return {"worker": worker, "i": i, "value": i * i}

t = time.perf_counter()
for i in range(n):
    result(w, i)
store.flush()
dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "requests": store.backend.requests, "calls": n}))
"""


def run_workers(loc: str, procs: int, calls: int, env: dict) -> tuple[float, list[dict]]:
    e = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    t = time.perf_counter()
    ps = [subprocess.Popen([sys.executable, "-c", WORKER, loc, str(w), str(calls)], env=e, stdout=subprocess.PIPE, text=True)
          for w in range(procs)]
    outs = [p.communicate()[0] for p in ps]
    wall = time.perf_counter() - t
    if any(p.returncode for p in ps):
        raise SystemExit("a worker failed")
    return wall, [json.loads(o.strip().splitlines()[-1]) for o in outs]


def count_entries(loc: str, env: dict) -> int:
    e = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    code = "import casmon, sys\ns = casmon.open(sys.argv[1])\nprint(len({k for k, _ in s.records('cache')}), s.verify().ok)"
    out = subprocess.run([sys.executable, "-c", code, loc], env=e, capture_output=True, text=True, check=True).stdout.split()
    if out[1] != "True":
        raise SystemExit(f"verify failed on {loc}")
    return int(out[0])


def start_moto() -> tuple[subprocess.Popen, str] | None:
    try:
        import boto3  # noqa: F401
        import moto  # noqa: F401
        import obstore  # noqa: F401
    except ImportError:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(150):
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1)
            return p, url
        except Exception:  # noqa: BLE001
            time.sleep(0.2)
    p.kill()
    return None


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--calls", type=int, default=1000)
    args = ap.parse_args(argv)
    console = Console(width=max(Console().width, 150))
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="casmon-share-"))
    with console.status("local folder"):
        wall1, _ = run_workers(str(tmp / "one"), 1, args.calls, {})
        n1 = count_entries(str(tmp / "one"), {})
        wall, outs = run_workers(str(tmp / "many"), args.procs, args.calls, {})
        n = count_entries(str(tmp / "many"), {})
    expected = args.procs * args.calls
    rows.append(("local folder", f"{args.procs} processes x {args.calls:,}", f"{n:,} of {expected:,}", expected - n,
                 f"{expected / wall:,.0f}/s", f"{n1 / wall1:,.0f}/s (1 process)", f"{(expected / wall) / (n1 / wall1):.2f}x", ""))
    moto = start_moto()
    if moto is None:
        rows.append(("S3 (moto)", "", "moto, boto3 or obstore not installed", "", "", "", "", ""))
    else:
        proc, url = moto
        try:
            import boto3

            env = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1",
                   "AWS_ENDPOINT_URL": url, "AWS_ALLOW_HTTP": "true"}
            bucket = "bench-" + uuid.uuid4().hex[:8]
            boto3.client("s3", endpoint_url=url, aws_access_key_id="bench", aws_secret_access_key="bench",
                         region_name="us-east-1").create_bucket(Bucket=bucket)
            with console.status("S3 (moto server)"):
                wall1, outs1 = run_workers(f"s3://{bucket}/one", 1, args.calls, env)
                n1 = count_entries(f"s3://{bucket}/one", env)
                wall, outs = run_workers(f"s3://{bucket}/many", args.procs, args.calls, env)
                n = count_entries(f"s3://{bucket}/many", env)
            reqs = sum(o["requests"] for o in outs) / sum(o["calls"] for o in outs)
            rows.append(("S3 (moto)", f"{args.procs} processes x {args.calls:,}", f"{n:,} of {expected:,}", expected - n,
                         f"{expected / wall:,.0f}/s", f"{n1 / wall1:,.0f}/s (1 process)", f"{(expected / wall) / (n1 / wall1):.2f}x",
                         f"{reqs:.3f}"))
        finally:
            proc.terminate()
    t = Table(title=f"many writers, one store — {os.cpu_count()} cores")
    for col in ("store", "workload", "entries", "lost", "throughput", "single process", "ratio", "S3 requests per cached call"):
        t.add_column(col)
    for r in rows:
        t.add_row(*[str(x) for x in r])
    console.print(t)


if __name__ == "__main__":
    main()
