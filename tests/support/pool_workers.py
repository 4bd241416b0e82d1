"""What the pool tests (tests/cache/test_pools.py) run in worker processes, and the driver that starts the pools.

The functions use the default store, so the store comes from ``$CASMON_STORE``,
as it would for a user's script. ``main`` runs the pool kinds named on its
command line one after the other, each the way people write it (a ``with``
block, a joblib call, a Dask cluster in a ``with``), prints one JSON line when
the pool has ended normally, and waits for a line on stdin before the next:
the test looks at the store in between, while this process (and loky's
reusable workers) are still alive, so nothing it finds was written by an exit
flush.
"""

from __future__ import annotations

import json
import sys

import casmon


@casmon.cache(label=lambda x: str(x))
def square(x):
    return x * x


@casmon.intercept
def log_value(i, v):
    return v


def work(i):
    """One task: a cached call and a logged call."""
    r = square(i)
    log_value(i, r)
    return r


def noisy(x):
    """Not cached here: tests cache it in two processes; every computation differs."""
    import os

    return (x, os.urandom(8))


def _mp_pool(method: str, xs: list) -> list:
    import multiprocessing as mp

    with mp.get_context(method).Pool(2) as pool:  # __exit__ terminates the workers (SIGTERM)
        return pool.map(work, xs)


def _mp_pool_many(method: str, xs: list) -> list:
    """Chunked, unordered tasks and workers replaced every 3 tasks, ended by the ``with`` block."""
    import multiprocessing as mp

    with mp.get_context(method).Pool(2, maxtasksperchild=3) as pool:
        return sorted(pool.imap_unordered(work, xs, chunksize=7))


def _executor(method: str, xs: list) -> list:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(2, mp_context=mp.get_context(method)) as ex:
        return list(ex.map(work, xs))


def _joblib(backend: str, xs: list) -> list:
    from joblib import Parallel, delayed

    return Parallel(n_jobs=2, backend=backend)(delayed(work)(x) for x in xs)


def _loky_killed(xs: list) -> list:
    """A joblib call, then loky's executor shut down by force: its workers get SIGKILL."""
    from joblib.externals.loky import get_reusable_executor

    out = _joblib("loky", xs)
    get_reusable_executor().shutdown(wait=True, kill_workers=True)
    return out


def _dask(xs: list) -> list:
    from dask.distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      host="127.0.0.1") as cluster, Client(cluster) as client:
        return client.gather(client.map(work, xs, pure=False))


#: kind -> how to run ``work`` over a list of inputs in that pool.
POOLS = {
    "pool-fork": lambda xs: _mp_pool("fork", xs),
    "pool-spawn": lambda xs: _mp_pool("spawn", xs),
    "pool-forkserver": lambda xs: _mp_pool("forkserver", xs),
    "executor-fork": lambda xs: _executor("fork", xs),
    "executor-spawn": lambda xs: _executor("spawn", xs),
    "joblib-loky": lambda xs: _joblib("loky", xs),
    "joblib-multiprocessing": lambda xs: _joblib("multiprocessing", xs),
    "dask": _dask,
    "joblib-loky-killed": _loky_killed,
    "pool-fork-many": lambda xs: _mp_pool_many("fork", xs),
    "pool-spawn-many": lambda xs: _mp_pool_many("spawn", xs),
}


def inputs(kind: str) -> list[int]:
    """Twenty inputs of one pool kind (200 for the ``-many`` kinds), distinct from every other kind's."""
    base = 1000 * (list(POOLS).index(kind) + 1)
    return list(range(base, base + (200 if kind.endswith("-many") else 20)))


def main(kinds: list[str], wait: bool = True) -> None:
    """Run each pool kind; after each, say so and (``wait``) wait for a line on stdin while the test looks."""
    for kind in kinds:
        xs = inputs(kind)
        out = POOLS[kind](xs)
        print(json.dumps({"kind": kind, "ok": out == [x * x for x in xs]}), flush=True)
        if wait:
            sys.stdin.readline()
