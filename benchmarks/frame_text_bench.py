"""A DataFrame of text: stored as columns (UTF-8 bytes and offsets) against one pickle, as before.

    python -m benchmarks.frame_text_bench --keep /work/benchstores/zarrcols      # build once, measure
    python -m benchmarks.frame_text_bench --keep /work/benchstores/zarrcols --rows 1000000   # quicker

The frame: ``--rows`` rows of short text (object dtype, ``f"n{i}"``), pandas 3's ``str`` dtype, a
categorical and a float column. Two stores under ``--keep``: ``columns`` (this layout) and ``pickle`` (the
pandas handler declining, as before text columns were columns). Each row of the table is one operation run in a
fresh process (``ru_maxrss`` is its peak memory), CPU seconds and wall seconds: ``put`` (store it), ``get``
(load it), ``view`` (``zarr.open_group(store.zarr())[entry/name][:]``, the text column through the view, the
columns store only), ``export`` (``store.export_zarr``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _frame(rows: int):  # type: ignore[no-untyped-def]
    import numpy as np
    import pandas as pd

    names = [f"n{i}" for i in range(rows)]
    df = pd.DataFrame({"name": names, "label": names, "split": pd.Categorical(["train", "test", "val", "train"] * (rows // 4)),
                       "x": np.arange(rows, dtype="f8")})
    df["name"] = df["name"].astype(object)
    return df


def _one(op: str, mode: str, where: Path, rows: int) -> dict[str, float]:
    import casmon
    from casmon.store.libraries.pandas import PandasHandler

    if mode == "pickle":
        PandasHandler.encode = lambda self, v: None  # type: ignore[method-assign,assignment]
    store = casmon.open(where / mode)
    t0, c0 = time.perf_counter(), time.process_time()
    if op == "put":
        df = _frame(rows)
        t0, c0 = time.perf_counter(), time.process_time()  # not the frame's making
        d = store.put(df)
        store.flush()
        (where / f"{mode}.digest").write_text(d.hex())
    else:
        from casmon.keys.digest import Digest

        d = Digest((where / f"{mode}.digest").read_text())
        if op == "get":
            store.get(d)
        elif op == "view":
            import zarr

            from casmon.store.zarrvalues import value_node
            from casmon.store.zarrview import Tree, ZarrView

            tree = Tree()
            value_node(store, tree, "v", d.hex(), {}, "bench")
            zarr.open_group(ZarrView(store, tree), mode="r")["v/name"][:]
        elif op == "export":
            out = where / f"export-{mode}"
            shutil.rmtree(out, ignore_errors=True)
            from casmon.store.zarrexport import export_zarr
            from casmon.store.zarrvalues import value_node
            from casmon.store.zarrview import Tree, ZarrView

            tree = Tree()
            tree.group("v")
            value_node(store, tree, "v/frame", d.hex(), {}, "bench")
            export_zarr(store, out, view=ZarrView(store, tree))
    return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "stored_mib": sum(f.stat().st_size for f in (where / mode).rglob("*") if f.is_file()) / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--keep", type=Path, default=None, help="where the stores are (built once)")
    ap.add_argument("--one", nargs=2, metavar=("OP", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    where = args.keep or Path(tempfile.mkdtemp())
    where.mkdir(parents=True, exist_ok=True)
    if args.one:
        print(json.dumps(_one(args.one[0], args.one[1], where, args.rows)))
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    print(f"{args.rows:,} rows; python {sys.version.split()[0]}")
    print(f"{'op':8} {'layout':8} {'wall s':>8} {'cpu s':>8} {'peak MiB':>9} {'store MiB':>9}")
    for op in ("put", "get", "view", "export"):
        for mode in ("columns", "pickle"):
            if op == "put" and (where / f"{mode}.digest").exists():
                continue  # built once
            if op == "view" and mode == "pickle":
                continue  # a pickle shows as a described group: nothing to read
            done = subprocess.run([sys.executable, "-m", "benchmarks.frame_text_bench", "--rows", str(args.rows),
                                   "--keep", str(where), "--one", op, mode], capture_output=True, text=True, env=env,
                                  cwd=ROOT)
            if done.returncode:
                print(done.stderr[-2000:])
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{op:8} {mode:8} {r['wall_s']:8.2f} {r['cpu_s']:8.2f} {r['peak_mib']:9.0f} {r['stored_mib']:9.1f}")


if __name__ == "__main__":
    main()
