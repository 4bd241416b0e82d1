"""Row 7's fresh process on its own: a user's script that opens a big store and makes its first cached call.

``python -c "from benchmarks.firsthit import main; main()" TOOL STORE KEY [numpy]``. Before the clock
starts it imports only what a script's first lines would (``sys`` and ``time``, and numpy with ``numpy``),
so a figure counts every module the tool loads, none that a benchmark harness loaded before it. It
prints one JSON line once the clock has stopped. ``work`` is the function the kept stores hold.
"""

import sys
import time

CALLS = [0]


def work(i):
    """The kept stores' function: trivial, so the figures are the cache's own cost."""
    CALLS[0] += 1
    return i * 2 + 1


def main() -> None:
    tool, d, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if sys.argv[4:] == ["numpy"]:
        import numpy  # noqa: F401 - as an ML script has it before it imports the cache

    t0 = time.perf_counter()
    if tool == "casmon":
        import casmon

        t1 = time.perf_counter()
        f = casmon.cache(store=casmon.open(d, create=False))(work)
    else:
        import diskcache

        t1 = time.perf_counter()
        f = diskcache.Cache(d).memoize()(work)
    t2 = time.perf_counter()
    r = f(k)
    t3 = time.perf_counter()
    import json

    assert r == k * 2 + 1 and CALLS[0] == 0, "the first call missed"
    print(json.dumps({"import_s": t1 - t0, "open_s": t2 - t1, "call_s": t3 - t2, "total_s": t3 - t0,
                      "modules": len(sys.modules)}))
