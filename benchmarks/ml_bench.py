"""The ML libraries' values (issue 25): keys, misses, hits and stored sizes beside each library's own save/load.

Run:  python -m benchmarks.ml_bench            (128 MiB tensors, about two minutes)
      python -m benchmarks.ml_bench --quick    (32 MiB, fewer repeats)

Every ratio compares casmon with a baseline measured in the same run, interleaved
(baseline, casmon, baseline, casmon, ...), as the median of per-repeat ratios.
Baselines: the same bytes as a numpy array (fingerprint), ``torch.save`` to a new
file and ``torch.load`` from the page cache (miss and hit), polars' ``write_ipc`` /
``read_ipc``, Arrow IPC, ``np.asarray`` of a jax array and ``jnp.asarray`` back.
Sizes: bytes of chunks the store holds against the distinct bytes put in.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any, Callable

import numpy as np

import casmon
from casmon.maintenance.usage import stats


def _time(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def ratio(casmon_fn: Callable[[], Any], base_fn: Callable[[], Any], repeats: int) -> tuple[float, float, float]:
    """(median casmon / baseline, median casmon seconds, median baseline seconds)."""
    rs, cs, bs = [], [], []
    for _ in range(repeats):
        b = _time(base_fn)
        c = _time(casmon_fn)
        rs.append(c / b)
        cs.append(c)
        bs.append(b)
    return statistics.median(rs), statistics.median(cs), statistics.median(bs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    mib = 32 if args.quick else 128
    repeats = 3 if args.quick else 5
    root = tempfile.mkdtemp(prefix="casmon-mlbench-")
    rows: list[tuple[str, str]] = []
    counter = iter(range(10**9))

    def row(name: str, r: tuple[float, float, float]) -> None:
        rows.append((name, f"{r[0]:.2f}x   ({r[1] * 1e3:.1f} ms vs {r[2] * 1e3:.1f} ms)"))

    try:
        import torch

        t = torch.randn(mib << 18)  # mib MiB of float32
        n = t.numpy().copy()
        row(f"fingerprint {mib} MiB tensor / same bytes as numpy", ratio(lambda: casmon.fingerprint(t), lambda: casmon.fingerprint(n), repeats))
        big = torch.zeros(256 << 20, dtype=torch.uint8)
        view = big[:1024]
        v = statistics.median(_time(lambda: casmon.fingerprint(view)) for _ in range(repeats))
        rows.append(("key of a 1 KiB view of a 256 MiB tensor", f"{v * 1e3:.3f} ms"))
        del big

        def fresh_store() -> Any:
            return casmon.open(os.path.join(root, f"s{next(counter)}"))

        def tsave() -> None:
            torch.save(t, os.path.join(root, f"t{next(counter)}.pt"))

        def miss() -> None:
            s = fresh_store()
            s.put(t)
            s.flush()

        row(f"miss: put {mib} MiB tensor / torch.save to a new file", ratio(miss, tsave, repeats))
        s = fresh_store()
        d = s.put(t)
        s.flush()
        s.get(d)
        pt = os.path.join(root, "load.pt")
        torch.save(t, pt)
        torch.load(pt)
        row(f"hit: get {mib} MiB tensor / torch.load from the page cache", ratio(lambda: s.get(d), lambda: torch.load(pt), repeats))

        s = fresh_store()
        sixteen = torch.randn(4 << 20)  # 16 MiB
        for _ in range(20):
            s.put(sixteen.clone())
        s.flush()
        rows.append(("20 equal 16 MiB tensors stored / one copy", f"{stats(s)['chunk_bytes'] / sixteen.nbytes:.3f}x"))
        s = fresh_store()
        gen = torch.Generator().manual_seed(0)
        ckpt = {f"w{i}": torch.randn(512, 512, generator=gen) for i in range(16)}
        distinct = sum(x.nbytes for x in ckpt.values())
        for step in range(10):
            if step:
                ckpt[f"w{step}"] = torch.randn(512, 512, generator=gen)
                distinct += ckpt[f"w{step}"].nbytes
            s.put(dict(ckpt))
        s.flush()
        rows.append(("10 checkpoints, one of 16 tensors changed each / distinct bytes", f"{stats(s)['chunk_bytes'] / distinct:.3f}x"))
    except ImportError:
        rows.append(("torch", "not installed"))

    try:
        import io

        import polars as pl

        df = pl.DataFrame({"a": np.arange(mib << 16), "b": np.random.default_rng(0).random(mib << 16)})
        s = casmon.open(os.path.join(root, "polars"))
        d = s.put(df)
        s.flush()
        ipc = os.path.join(root, "frame.arrow")
        df.write_ipc(ipc, compression="uncompressed")
        pl.read_ipc(ipc)
        row(f"hit: get {df.estimated_size() >> 20} MiB polars frame / pl.read_ipc of a file in the page cache",
            ratio(lambda: s.get(d).sum(), lambda: pl.read_ipc(ipc).sum(), repeats))
        cols = [df[c].to_numpy() for c in df.columns]
        row("fingerprint polars frame / its columns as numpy",
            ratio(lambda: casmon.fingerprint(df), lambda: casmon.fingerprint(cols), repeats))
        row(f"miss: put polars frame / df.write_ipc to memory",
            ratio(lambda: casmon.open(os.path.join(root, f"p{next(counter)}")).put(df),
                  lambda: df.write_ipc(io.BytesIO(), compression="uncompressed"), repeats))
    except ImportError:
        rows.append(("polars", "not installed"))

    try:
        import jax.numpy as jnp

        j = jnp.asarray(np.random.default_rng(0).random(mib << 17).astype(np.float32))
        s = casmon.open(os.path.join(root, "jax"))
        d = s.put(j)
        s.flush()
        host = np.asarray(j)
        row("hit: get jax array / jnp.asarray of the host copy", ratio(lambda: s.get(d), lambda: jnp.asarray(host.copy()), repeats))
    except ImportError:
        rows.append(("jax", "not installed"))

    a = np.asfortranarray(np.random.default_rng(0).random((4096, mib * 32)))
    c = np.ascontiguousarray(a)
    row("fingerprint Fortran-ordered matrix / its C-order copy", ratio(lambda: casmon.fingerprint(a), lambda: casmon.fingerprint(c), repeats))
    shutil.rmtree(root, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    main()
