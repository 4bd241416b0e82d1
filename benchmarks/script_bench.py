"""Row 10: a user's script whose cached call hits, timed as the user runs it: the whole ``python script.py``.

``python -m benchmarks.script_bench [--rounds N] [--casmon TREE] [--before TREE]``. Three scripts per value, each with its bytecode cached
(each runs once first): one whose ``@casmon.cache`` call hits, one that loads the same value from a file
(``np.load`` for a 32 MB float array, ``pd.read_parquet`` for a 34 MB DataFrame), and one whose
``joblib.Memory`` call hits. They run interleaved, round after round, so a loaded machine slows each alike;
the figures are medians of the wall time and of the process's CPU time (user + system, all threads).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MAKE_ARRAY = """
def make(seed, n):
    return np.random.default_rng(seed).random(n)
"""
MAKE_FRAME = """
def make(seed, n):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"a": rng.random(n), "b": rng.random(n), "c": rng.random(n).astype("float32"),
                         "d": rng.random(n)})
"""
#: (value, its make(), arguments, the import line, the file load, the file's writer)
VALUES = {
    "array": (MAKE_ARRAY, "1, 4_000_000", "import numpy as np", "np.load({f!r})", "np.save({f!r}, v)", "npy"),
    "frame": (MAKE_FRAME, "1, 1_215_000", "import numpy as np\nimport pandas as pd", "pd.read_parquet({f!r})",
              "v.to_parquet({f!r})", "parquet"),
}


def scripts(d: Path, what: str) -> dict[str, Path]:
    make, args, imports, load, save, ext = VALUES[what]
    f = str(d / f"{what}.{ext}")
    src = {
        "casmon": f"{imports}\nimport casmon\n\n@casmon.cache(store=casmon.open({str(d / ('store-' + what))!r}))"
                  f"{make}\nv = make({args})\n",
        "file": f"{imports}\nv = {load.format(f=f)}\n",
        "joblib": f"{imports}\nimport joblib\n\nmem = joblib.Memory({str(d / ('joblib-' + what))!r}, verbose=0)\n\n@mem.cache"
                  f"{make}\nv = make({args})\n",
    }
    out = {}
    for name, text in src.items():
        p = d / f"{what}_{name}.py"
        p.write_text(textwrap.dedent(text))
        out[name] = p
    writer = d / f"{what}_write.py"
    writer.write_text(f"{imports}\n{make}\nv = make({args})\n{save.format(f=f)}\n")
    return {"write": writer, **out}


def run(script: Path, env: dict) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, str(script)], env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bench(rounds: int, casmon: Path = ROOT, before: Path | None = None) -> list[tuple]:
    env = dict(os.environ, PYTHONPATH=str(casmon))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as users run scripts: bytecode cached
    envs = {"casmon": env, "file": env, "joblib": env}
    if before is not None:  # the same casmon script on another source tree, interleaved with the rest
        envs["before"] = dict(env, PYTHONPATH=str(before))
    d = Path(tempfile.mkdtemp(prefix="casmon-script-"))
    rows = []
    try:
        for what in VALUES:
            s = scripts(d, what)
            s["before"] = s["casmon"]
            run(s["write"], env)
            for name in envs:
                run(s[name], envs[name])  # the miss, and the bytecode
                run(s[name], envs[name])
            got: dict[str, list[tuple[float, float]]] = {n: [] for n in envs}
            for _ in range(rounds):
                for name in got:
                    got[name].append(run(s[name], envs[name]))
            wall = {n: statistics.median(x[0] for x in v) for n, v in got.items()}
            cpu = {n: statistics.median(x[1] for x in v) for n, v in got.items()}
            load = "np.load" if what == "array" else "pd.read_parquet"
            size = "32 MB array" if what == "array" else "34 MB DataFrame"
            for kind, m in (("wall", wall), ("CPU", cpu)):
                rows.append(("10", f"script whose cached call hits a {size}, whole process ({kind})", m["casmon"],
                             f"script that calls {load}", m["file"], 1.15))
                rows.append(("10", f"the same ({kind})", m["casmon"], "joblib.Memory's script", m["joblib"],
                             0.7 if what == "array" else None))
                if before is not None:
                    rows.append(("10", f"the same ({kind})", m["casmon"], f"casmon at {before.name}", m["before"], None))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--casmon", type=Path, default=ROOT, help="the source tree to measure (another commit's)")
    ap.add_argument("--before", type=Path, help="also time the casmon script on this tree, interleaved")
    args = ap.parse_args(argv)
    print(f"casmon {args.casmon}; Python {sys.version.split()[0]}; {os.cpu_count()} cores; load {os.getloadavg()[0]:.2f}\n")
    print("| row | what | casmon | peer | peer's | ratio | goal |\n|---|---|---|---|---|---|---|")
    for num, what, c, peer, p, goal in bench(args.rounds, args.casmon, args.before):
        print(f"| {num} | {what} | {c * 1e3:.0f} ms | {peer} | {p * 1e3:.0f} ms | {c / p:.2f}x | "
              f"{'≤ %.2fx' % goal if goal else ''} |")


if __name__ == "__main__":
    main()
