"""Cache writers in several processes while gc runs again and again with a short grace, and is killed at each of
its named fault points: no acknowledged entry is lost (one a flush returned from), the next gc after a kill
recovers (takes the dead gc's lock over, publishes a checked fence), and the store verifies sound."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import pytest

import casmon
from casmon import faultpoints
from tests.store.test_protocol import GC_POINTS

GRACE = 2.0  # the most aggressive grace the soak uses (CASMON_MIN_GRACE)
N = 3000


def result(i: int) -> np.ndarray:
    return np.full(N, float(i % 12))


def value(w: int, i: int) -> np.ndarray:
    return result(i)


def _writer(loc: str, w: int, until: float, acked: str) -> None:
    s = casmon.open(loc, autoflush=None)
    cached = casmon.cache(store=s)(value)
    done = []
    i = 0
    while time.time() < until:
        if i % 4 == 0:
            s.put(result(i + 6))  # garbage: condemned and swept, then stored again as a result (deduplicated)
        cached(w, i)
        done.append(i)
        if i % 5 == 4:
            s.flush()
            with open(acked, "a") as f:  # acknowledged: the flush returned
                f.write("".join(f"{j}\n" for j in done))
            done = []
        i += 1
    s.close()
    os._exit(0)


def _gc(loc: str, spec: str) -> None:
    if spec:
        faultpoints.configure(spec)
    casmon.open(loc).gc(grace=GRACE)
    os._exit(0)


def _race(tmp_path: Path, seconds: float, writers: int) -> tuple[int, int, int, set[str]]:
    loc = str(tmp_path / "s")
    casmon.open(loc).close()
    ctx = multiprocessing.get_context("fork")
    until = time.time() + seconds
    acked = [tmp_path / f"acked{w}" for w in range(writers)]
    ws = [ctx.Process(target=_writer, args=(loc, w, until, str(acked[w]))) for w in range(writers)]
    for p in ws:
        p.start()
    gcs = kills = 0
    killed_at: set[str] = set()
    while time.time() < until:
        point = GC_POINTS[(gcs // 2) % len(GC_POINTS)]
        p = ctx.Process(target=_gc, args=(loc, f"{point}=kill" if gcs % 2 else ""))  # every other gc is killed
        p.start()
        p.join(120)
        assert p.exitcode in (0, -9), p.exitcode
        gcs += 1
        if p.exitcode == -9:
            kills += 1
            killed_at.add(point)
    for p in ws:
        p.join(120)
        assert p.exitcode == 0
    time.sleep(GRACE)
    for _ in range(2):  # the next gcs recover from the killed ones and sweep what is due
        casmon.open(loc).gc(grace=GRACE)
    got = casmon.cache(store=casmon.open(loc, read_only=True))(value)
    n = 0
    lost = []
    for w in range(writers):
        for line in acked[w].read_text().split() if acked[w].exists() else []:
            i = int(line)
            try:
                ok = np.array_equal(got.lookup(w, i), result(i))
            except KeyError:
                ok = False
            n += 1
            if not ok:
                lost.append((w, i))
    assert not lost, f"{len(lost)} of {n} acknowledged entries lost: {lost[:10]}"
    rep = casmon.open(loc).verify()
    assert rep.ok, rep.as_dict()
    return n, gcs, kills, killed_at


def test_writers_racing_a_gc_killed_at_each_step_lose_no_acknowledged_entry(tmp_path, min_grace, figures):
    min_grace(GRACE)
    n, gcs, kills, killed_at = _race(tmp_path, 4.0, 2)
    assert n > 0 and gcs >= 2
    figures("gc race: acknowledged entries, all found", n)
    figures("gc race: gc runs", gcs)
    figures("gc race: gc runs killed at a fault point", kills)
    figures("gc race: fault points a gc was killed at", len(killed_at))


@pytest.mark.slow
def test_writers_racing_a_gc_killed_at_each_step_lose_no_acknowledged_entry_long(tmp_path, min_grace, figures):
    min_grace(GRACE)
    n, gcs, kills, killed_at = _race(tmp_path, 60.0, 4)
    assert len(killed_at) >= 3, killed_at  # gc.before_sweep is reached only where a list is due
    figures("gc race: acknowledged entries, all found", n)
    figures("gc race: gc runs", gcs)
    figures("gc race: gc runs killed at a fault point", kills)
    figures("gc race: fault points a gc was killed at", len(killed_at))
