"""What runs keep (issue 42): fine-tunes deduplicated, state_dicts saved and loaded, large files re-stored.

Run:  python -m benchmarks.artifacts_bench                         (100 MiB backbone, 512 MiB state_dict,
                                                                   256 MiB file; a few minutes, ~4 GiB disk)
      python -m benchmarks.artifacts_bench --backbone 32 --state 128 --file 256   (a loaded 2-core machine)

Workloads, each against a baseline measured in the same run:

* **fine-tunes**: 10 fine-tunes of a model with a frozen backbone of ``--backbone`` MiB (float32) and a
  changed 1 MiB head, each saved as a run artifact with ``run.save`` (and, for comparison, as a
  ``torch.save`` file each). Stored bytes (the store's object files) against the distinct bytes (one
  backbone and ten heads).
* **state_dict**: a ``--state`` MiB state_dict of random float32 tensors: ``run.save`` against
  ``torch.save`` and ``safetensors.torch.save_file`` to a new file; loading back against ``torch.load``;
  the mapped variant (``run.save(..., mmap=True)``, ``load(..., mmap=True)``) against ``torch.load``.
  Medians of ``--repeats`` (loads: two each per repeat), interleaved; each save goes to a fresh name (a fresh
  store for casmon); loads read files just written (the page cache).
* **insert**: a ``--file`` MiB file of random bytes saved with ``run.save_file``; then 1 KiB inserted at
  1 MiB and saved again: the bytes the store grew by.
* **cutting**: the content-defined chunker's speed (numpy gear hash) against the ``fastcdc`` package
  (its compiled and pure-Python builds) if it is importable, on the same bytes.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import casmon

MiB = 1 << 20


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _objects(path: Path) -> int:
    return sum(_du(path / sub) for sub in ("objects", "packs") if (path / sub).exists())


def _time(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def fine_tunes(root: Path, backbone_mib: int, n: int = 10) -> list[tuple[str, str]]:
    import torch

    rng = np.random.default_rng(0)
    per = backbone_mib * MiB // 4 // 8
    backbone = {f"backbone.{i}.weight": torch.from_numpy(rng.standard_normal(per, dtype=np.float32)) for i in range(8)}
    s = casmon.open(root / "ft", create=True)
    distinct = sum(t.numel() * 4 for t in backbone.values())
    torch_bytes = 0
    t_casmon = t_torch = 0.0
    for k in range(n):
        head = {"head.weight": torch.from_numpy(rng.standard_normal(MiB // 4, dtype=np.float32))}
        distinct += MiB
        sd = {**backbone, **head}
        with casmon.record(store=s, capture_output=False, comment=f"ft{k}") as run:
            t_casmon += _time(lambda: run.save("model", sd))
        f = root / f"ft{k}.pt"
        t_torch += _time(lambda: torch.save(sd, f))
        torch_bytes += f.stat().st_size
    s.flush()
    stored = _objects(root / "ft")
    s.close()
    return [("distinct bytes (1 backbone + 10 heads)", f"{distinct / MiB:.1f} MiB"),
            ("casmon: stored (objects and packs)", f"{stored / MiB:.1f} MiB = {stored / distinct:.3f}x distinct (goal <= 1.05x)"),
            ("torch.save files", f"{torch_bytes / MiB:.1f} MiB = {torch_bytes / distinct:.2f}x distinct"),
            ("time to save all 10", f"casmon {t_casmon:.2f} s, torch.save {t_torch:.2f} s")]


def state_dict(root: Path, mib: int, repeats: int) -> list[tuple[str, str]]:
    import torch
    from safetensors.torch import save_file

    rng = np.random.default_rng(1)
    sizes = [mib * MiB // 16 // 4] * 16  # 16 tensors, float32
    sd = {f"layer{i}.weight": torch.from_numpy(rng.standard_normal(n, dtype=np.float32)) for i, n in enumerate(sizes)}
    counter = iter(range(10**6))
    saves: dict[str, list[float]] = {"casmon": [], "casmon mmap": [], "torch": [], "safetensors": []}
    loads: dict[str, list[float]] = {"casmon": [], "casmon mmap": [], "torch": []}
    for _ in range(repeats):
        i = next(counter)
        pt, st = root / f"sd{i}.pt", root / f"sd{i}.safetensors"
        saves["torch"].append(_time(lambda: torch.save(sd, pt)))
        saves["safetensors"].append(_time(lambda: save_file(sd, str(st))))
        s = casmon.open(root / f"sd{i}", create=True)
        with casmon.record(store=s, capture_output=False) as run:
            saves["casmon"].append(_time(lambda: run.save("sd", sd)))
            saves["casmon mmap"].append(_time(lambda: run.save("sd-mapped", sd, mmap=True)))
        r = casmon.load_run("latest", s)
        for _ in range(2):  # interleaved, each from the page cache; the first of a fresh store's reads included
            loads["torch"].append(_time(lambda: torch.load(pt, weights_only=True)))
            loads["casmon"].append(_time(lambda: r.load("sd")))
            loads["casmon mmap"].append(_time(lambda: r.load("sd-mapped", mmap=True)))
        s.close()
        shutil.rmtree(root / f"sd{i}")
        pt.unlink()
        st.unlink()
    med = {k: statistics.median(v) for k, v in saves.items()}
    lmed = {k: statistics.median(v) for k, v in loads.items()}
    return [("run.save", f"{med['casmon'] * 1e3:.0f} ms"),
            ("torch.save", f"{med['torch'] * 1e3:.0f} ms; run.save / it = {med['casmon'] / med['torch']:.2f}x (goal <= 1.0x)"),
            ("safetensors save_file", f"{med['safetensors'] * 1e3:.0f} ms; run.save / it = "
                                      f"{med['casmon'] / med['safetensors']:.2f}x (goal <= 1.0x)"),
            ("run.save(mmap=True)", f"{med['casmon mmap'] * 1e3:.0f} ms"),
            ("load", f"{lmed['casmon'] * 1e3:.0f} ms; torch.load {lmed['torch'] * 1e3:.0f} ms; "
                     f"{lmed['casmon'] / lmed['torch']:.2f}x (goal <= 1.0x)"),
            ("load(mmap=True)", f"{lmed['casmon mmap'] * 1e3:.0f} ms; {lmed['casmon mmap'] / lmed['torch']:.2f}x "
                                f"torch.load (goal <= 0.25x)")]


def insert(root: Path, mib: int) -> list[tuple[str, str]]:
    rng = np.random.default_rng(2)
    f = root / "big.bin"
    with open(f, "wb") as out:
        for _ in range(mib):
            out.write(rng.bytes(MiB))
    s = casmon.open(root / "ins", create=True)
    with casmon.record(store=s, capture_output=False) as run:
        t1 = _time(lambda: run.save_file(f))
    s.flush()
    before = _objects(root / "ins")
    with open(f, "rb") as src, open(root / "big2.bin", "wb") as out:
        out.write(src.read(MiB))
        out.write(rng.bytes(1024))
        shutil.copyfileobj(src, out, 16 * MiB)
    os.replace(root / "big2.bin", f)
    with casmon.record(store=s, capture_output=False) as run:
        t2 = _time(lambda: run.save_file(f))
    s.flush()
    grew = _objects(root / "ins") - before
    r = casmon.load_run("latest", s)
    t3 = _time(lambda: r.load_file("big.bin", root / "back.bin"))
    s.close()
    return [(f"first save of the {mib} MiB file", f"{t1:.2f} s ({mib / t1:.0f} MiB/s)"),
            ("saved again with 1 KiB inserted at 1 MiB", f"store grew {grew / MiB:.2f} MiB (goal <= 2 MiB), in {t2:.2f} s"),
            ("load_file back", f"{t3:.2f} s ({mib / t3:.0f} MiB/s)")]


def cutting(mib: int) -> list[tuple[str, str]]:
    from casmon.store import cdc

    data = np.random.default_rng(3).bytes(mib * MiB)
    rows = []
    t = min(_time(lambda: list(cdc.pieces(io.BytesIO(data)))) for _ in range(3))
    rows.append(("casmon numpy gear hash", f"{mib / t:.0f} MiB/s"))
    try:
        from fastcdc import fastcdc_cy, fastcdc_py  # type: ignore[import-not-found]
    except ImportError:
        rows.append(("fastcdc", "not installed (pip install fastcdc)"))
        return rows
    t = min(_time(lambda: list(fastcdc_cy.fastcdc_cy(data, 512 << 10, 1 << 20, 8 << 20, False, None))) for _ in range(3))
    rows.append(("fastcdc, compiled (Cython)", f"{mib / t:.0f} MiB/s"))
    small = data[: 8 * MiB]
    t = _time(lambda: list(fastcdc_py.fastcdc_py(small, 512 << 10, 1 << 20, 8 << 20, False, None)))
    rows.append(("fastcdc, pure Python (8 MiB)", f"{8 / t:.1f} MiB/s"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backbone", type=int, default=100, help="MiB of frozen backbone (default 100)")
    ap.add_argument("--state", type=int, default=512, help="MiB of state_dict (default 512)")
    ap.add_argument("--file", type=int, default=256, help="MiB of the large file (default 256)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="finetune,state,insert,cut")
    args = ap.parse_args()
    only = set(args.only.split(","))
    root = Path(tempfile.mkdtemp(prefix="casmon-artbench-"))
    try:
        for key, title, fn in (
                ("finetune", f"10 fine-tunes, frozen {args.backbone} MiB backbone, changed 1 MiB head",
                 lambda: fine_tunes(root, args.backbone)),
                ("state", f"{args.state} MiB state_dict: save and load", lambda: state_dict(root, args.state, args.repeats)),
                ("insert", f"{args.file} MiB file, 1 KiB inserted at 1 MiB, saved again", lambda: insert(root, args.file)),
                ("cut", "content-defined cutting speed, 64 MiB random bytes", lambda: cutting(64))):
            if key not in only:
                continue
            rows = fn()
            print(f"\n## {title}\n")
            print("| what | figure |\n|---|---|")
            for what, fig in rows:
                print(f"| {what} | {fig} |")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
