"""Randomized storage-fault campaigns (``--runslow``): S3 behind a fault-injecting proxy, and a full tmpfs.

Writers make cached, logged and recorded calls and note each flush that returned (what is
acknowledged); the proxy fails requests at random (503, 500, resets, lost replies, delays, late
writes), whole outages come and go, writers are SIGKILLed and replaced, and gc runs in a loop at the
most aggressive grace. Afterwards, read straight from moto: verify is clean, every acknowledged call
is there exactly once, no record names a removed value, and no exception reached a writer's own code.
The figures go to docs/RELIABILITY.md ("reliability figures" at the end of the run).
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import casmon
from tests.conftest import ROOT, fill_disk
from tests.support.s3proxy import Rule
from tests.support.stores import assert_no_record_names_a_removed_value

pytestmark = pytest.mark.slow

SECONDS = float(os.environ.get("CASMON_CAMPAIGN_SECONDS", "120"))

WRITER = r"""
import json, os, sys, time, traceback, warnings
warnings.simplefilter("ignore")
import casmon
url, wid, out, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
s = casmon.open(url)

@casmon.intercept(store=s)
def logged(wid, i):
    return i * i

@casmon.cache(store=s)
def square(x):
    return [x] * 200

def note(**kw):
    with open(out, "a") as f:
        f.write(json.dumps(kw) + "\n")

end = time.time() + seconds
i = 0
while time.time() < end:
    try:
        assert logged(wid, i) == i * i
        assert square(i % 40) == [i % 40] * 200
        if i % 150 == 0:
            with casmon.record(store=s, capture_output=False, comment=wid) as run:
                run.info["i"] = i
    except Exception:
        note(error=traceback.format_exc())
    i += 1
    if i % 50 == 0:
        try:
            s.flush()
        except casmon.StoreError as e:
            note(flush_failed=str(e)[:200])
        else:
            note(acked=i)
    time.sleep(0.002)
note(done=i)
"""

GC = r"""
import sys, time, warnings
warnings.simplefilter("ignore")
import casmon
s = casmon.open(sys.argv[1], create=False)
end, runs, failed = time.time() + float(sys.argv[2]), 0, 0
while time.time() < end:
    try:
        s.gc(grace=float(sys.argv[3]))
        runs += 1
    except casmon.StoreError:
        failed += 1
    time.sleep(0.5)
print(runs, failed)
"""


def _spawn(code, *args, env):
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _check(direct, notes: dict[str, list[dict]], figures, prefix: str):
    assert_no_record_names_a_removed_value(direct)
    log = casmon.load(direct)
    names = [f for f in log.functions if f.rsplit(".", 1)[-1] == "logged"]
    assert len(names) == 1, log.functions
    calls = log.calls(names[0])
    seen: dict[tuple[str, int], int] = {}
    where: dict[tuple[str, int], list] = {}
    for c in calls:
        (wid, i), _kw = c.inputs()
        seen[(wid, i)] = seen.get((wid, i), 0) + 1
        where.setdefault((wid, i), []).append((c.session, c.n, c.pid, c.start))
    dup = sum(n - 1 for n in seen.values())
    if dup:
        t = direct.table("call")
        t.refresh()
        twice = sorted(k for k, n in seen.items() if n > 1)
        print("DUPLICATES", twice[:3], [where[k] for k in twice[:3]], "l0:", sorted(t._l0)[:40], "late:", t.late,
              "gens:", sorted(t._gens))
    lost = 0
    errors = []
    acked_total = 0
    for wid, ns in notes.items():
        acked = max((n["acked"] for n in ns if "acked" in n), default=0)
        acked_total += acked
        lost += sum(1 for i in range(acked) if (wid, i) not in seen)
        errors += [n["error"] for n in ns if "error" in n]
    figures(f"{prefix}: acknowledged calls checked", acked_total)
    figures(f"{prefix}: acknowledged calls lost", lost)
    figures(f"{prefix}: calls counted twice", dup)
    figures(f"{prefix}: exceptions into user code", len(errors))
    assert not errors, errors[:3]
    assert lost == 0 and dup == 0, (lost, dup, os.environ.get("CASMON_CAMPAIGN_SEED"))


def _kill_one(writers: dict[str, subprocess.Popen], rng: random.Random) -> None:
    """SIGKILL one writer, chosen at random, and forget it (the caller starts its replacement)."""
    wid, p = rng.choice(sorted(writers.items()))
    p.send_signal(signal.SIGKILL)
    p.wait()
    del writers[wid]


def _notes(folder: Path) -> dict[str, list[dict]]:
    out = {}
    for f in folder.glob("*.jsonl"):
        out[f.stem] = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


def test_random_s3_faults_outages_and_kills(s3_proxy, moto_server, tmp_path, figures):
    proxy, bucket = s3_proxy
    seed = int(os.environ.get("CASMON_CAMPAIGN_SEED", random.randrange(1 << 30)))
    print("seed", seed)
    rng = random.Random(seed)
    proxy.random = random.Random(seed + 1)
    url = f"s3://{bucket}/s"
    casmon.open(url).close()
    env = dict(os.environ, PYTHONPATH=str(ROOT), CASMON_MIN_GRACE="1", CASMON_LOCK_LEASE="6",
               AWS_ENDPOINT_URL=proxy.url)
    for rule in (Rule("status", status=503, probability=0.02), Rule("status", status=500, probability=0.005),
                 Rule("reset", probability=0.005), Rule("drop_after", probability=0.005),
                 Rule("drop_before", probability=0.005), Rule("truncate", method="GET", probability=0.003),
                 Rule("delay_before", delay=1.5, probability=0.01), Rule("hold", method="PUT", delay=4.0, probability=0.004)):
        proxy.add(rule)
    notes = tmp_path / "notes"
    notes.mkdir()
    writers: dict[str, subprocess.Popen] = {}
    n_writers, kills, outages = 3, 0, 0

    def start() -> None:
        wid = f"w{len(list(notes.iterdir()))}-{rng.randrange(1 << 20):x}"
        (notes / f"{wid}.jsonl").touch()
        writers[wid] = _spawn(WRITER, url, wid, notes / f"{wid}.jsonl", SECONDS, env=env)

    for _ in range(n_writers):
        start()
    gc = _spawn(GC, url, SECONDS + 5, 1.0, env=env)
    end = time.monotonic() + SECONDS
    try:
        while time.monotonic() < end:
            time.sleep(rng.uniform(2, 8))
            r = rng.random()
            if r < 0.3:
                proxy.outage(rng.uniform(3, 15), rng.choice(["503", "reset", "drop"]))
                outages += 1
            elif r < 0.6:
                _kill_one(writers, rng)
                kills += 1
                start()
        for p in writers.values():
            p.communicate(timeout=SECONDS + 120)
        gc_out = gc.communicate(timeout=120)[0]
    finally:
        for p in [*writers.values(), gc]:
            if p.poll() is None:
                p.kill()
    proxy.clear()
    figures("s3 campaign: seconds", int(SECONDS))
    figures("s3 campaign: requests", proxy.counts())
    figures("s3 campaign: faults injected", sum(1 for x in proxy.log if x.action not in (None, "forward")))
    figures("s3 campaign: outages", outages)
    figures("s3 campaign: writers killed", kills)
    figures("s3 campaign: gc runs", int(gc_out.split()[0]) if gc_out.split() else 0)
    direct = casmon.open(url, storage_options={"endpoint": moto_server}, create=False)
    _check(direct, _notes(notes), figures, "s3 campaign")


def test_random_full_disk_and_kills(small_disk, tmp_path, figures):
    disk = small_disk("24m")
    loc = disk / "s"
    casmon.open(loc).close()
    rng = random.Random(int(os.environ.get("CASMON_CAMPAIGN_SEED", random.randrange(1 << 30))))
    env = dict(os.environ, PYTHONPATH=str(ROOT), CASMON_MIN_GRACE="1")
    notes = tmp_path / "notes"
    notes.mkdir()
    writers: dict[str, subprocess.Popen] = {}
    kills = fills = 0

    def start() -> None:
        wid = f"w{len(list(notes.iterdir()))}"
        (notes / f"{wid}.jsonl").touch()
        writers[wid] = _spawn(WRITER, loc, wid, notes / f"{wid}.jsonl", SECONDS, env=env)

    for _ in range(3):
        start()
    gc = _spawn(GC, loc, SECONDS + 5, 1.0, env=env)
    end = time.monotonic() + SECONDS
    try:
        while time.monotonic() < end:
            time.sleep(rng.uniform(2, 6))
            if rng.random() < 0.5:
                filler = fill_disk(disk)
                fills += 1
                time.sleep(rng.uniform(1, 6))
                filler.unlink()
            else:
                _kill_one(writers, rng)
                kills += 1
                start()
        for p in writers.values():
            p.communicate(timeout=SECONDS + 120)
        gc.communicate(timeout=120)
    finally:
        for p in [*writers.values(), gc]:
            if p.poll() is None:
                p.kill()
    figures("full-disk campaign: seconds", int(SECONDS))
    figures("full-disk campaign: times the disk was filled", fills)
    figures("full-disk campaign: writers killed", kills)
    _check(casmon.open(loc, create=False), _notes(notes), figures, "full-disk campaign")
