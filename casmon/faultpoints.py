"""Named fault points: places in the write, merge and gc protocols where a test may stop or kill a process.

The protocols of :mod:`casmon.store.store`, :mod:`casmon.store.table` and :mod:`casmon.maintenance.collect`
call :func:`point` at every step whose interleaving with another process
matters (``"flush.after_pack"``, ``"gc.after_mark"``, ...). Nothing happens
unless the environment variable ``CASMON_FAULTPOINTS`` names the point, so the
cost in normal use is one dict lookup on a flag that is False.

``CASMON_FAULTPOINTS`` is a comma-separated list of ``name=action``:

``kill``
    SIGKILL this process at the point (a crash at exactly that step).
``interrupt``
    raise ``KeyboardInterrupt`` at the point (Ctrl-C at exactly that step).
``pause:DIR``
    create ``DIR/{name}.reached``, then wait until ``DIR/{name}.go`` exists
    (a test drives another process meanwhile), then go on.
``count:DIR``
    append one line to ``DIR/{name}.count`` (how often the point was passed).

An action may carry ``@N`` after the name (``flush.after_pack@3=kill``): act
only on the N-th time the point is reached (1-based). Tests also use
:func:`configure` to set points inside the test process.
"""

from __future__ import annotations

import os
import _thread  # threading's locks, without loading threading on a hit
import time

__all__ = ["point", "configure", "POINTS"]

#: Every fault point the code calls, with the protocol step it marks. Tests walk this list.
POINTS: dict[str, str] = {
    # writer: Store.flush
    "flush.sealed": "records and objects of this flush are set aside; nothing written yet",
    "flush.after_pack": "the pack of small objects is written, its index entries are not",
    "flush.after_index": "the pack's index entries are written, no record yet",
    "flush.table_written": "one kind's record table is written, the next kind's not yet",
    "flush.after_records": "the record tables are written, nothing merged yet",
    # writer: Store.put
    "put.after_chunks": "a value's large chunks are written, its manifest waits in memory",
    # writer: a local folder's file (casmon.store.backend)
    "local.partial_written": "a file's ``*.partial`` copy is written, not yet linked or renamed into place",
    # table merge
    "merge.after_buckets": "a generation's buckets are written, its manifest is not",
    "merge.after_manifest": "a generation's manifest is visible, the files it covers are not deleted",
    # gc
    "gc.locked": "gc holds the gc lock, nothing read yet",
    "gc.after_mark": "gc knows what records and refs reach",
    "gc.after_condemn": "gc wrote its list of condemned objects",
    "gc.before_sweep": "gc is about to delete the objects of an old condemned list",
    "gc.after_sweep": "gc deleted loose objects and rewrote the index and packs",
    # runs: a large file saved in pieces (casmon.runs.pieces)
    "pieces.after_piece": "one more piece of a large file is put, the file is not read to its end",
    "pieces.after_listing": "a large file's piece list is put, no artifact record names it yet",
    # runs: record(resume=...) and delete_run
    "resume.after_claim": "a resume's claim ref is written, nothing of the run carried over yet",
    "resume.after_attach": "a resumed run has carried over its metrics, output and checkpoints, written nothing",
    "delete.after_records": "a run deletion rewrote the tables without its records; its claims and ref remain",
    # runs: metric compaction (casmon.runs.compaction)
    "compact.appended": "a run's compacted metric record is appended, not yet flushed",
    "compact.written": "the compacted record is written; the small batches it covers are all still there",
    "compact.retired": "the tables are rewritten without the covered batches, the lock not yet released",
    # runs: the runs index (casmon.runs.index)
    "index.delta_written": "an ended run's entry is written to the runs index as a delta file",
    "index.base_written": "a new runs index is in place; the delta files it folded in are not deleted yet",
    "index.delta_deleted": "one more delta file folded into a new runs index is deleted, the others not yet",
}

_lock = _thread.allocate_lock()
_actions: dict[str, tuple[str, str, int]] = {}  # name -> (action, arg, only the n-th time; 0 = every time)
_counts: dict[str, int] = {}
enabled = False


def configure(spec: str | None) -> None:
    """Set the active points from a ``CASMON_FAULTPOINTS`` string (None or "" clears them)."""
    global enabled
    actions: dict[str, tuple[str, str, int]] = {}
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, _, action = item.partition("=")
        name, _, nth = name.partition("@")
        action, _, arg = action.partition(":")
        if name not in POINTS:
            raise ValueError(f"CASMON_FAULTPOINTS: unknown fault point {name!r}; known: {', '.join(POINTS)}")
        if action not in ("kill", "interrupt", "pause", "count"):
            raise ValueError(f"CASMON_FAULTPOINTS: unknown action {action!r} for {name!r}")
        actions[name] = (action, arg, int(nth) if nth else 0)
    with _lock:
        _actions.clear()
        _actions.update(actions)
        _counts.clear()
        enabled = bool(actions)


def point(name: str) -> None:
    """Mark protocol step ``name``; acts only if a test asked for it."""
    if not enabled:
        return
    a = _actions.get(name)
    if a is None:
        return
    action, arg, nth = a
    with _lock:
        n = _counts[name] = _counts.get(name, 0) + 1
    if nth and n != nth:
        return
    if action == "kill":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)  # the signal is delivered before this ends
    elif action == "interrupt":
        raise KeyboardInterrupt(f"fault point {name}")
    elif action == "pause":
        from pathlib import Path

        d = Path(arg)
        (d / f"{name}.reached").write_text(str(os.getpid()))
        go = d / f"{name}.go"
        while not go.exists():
            time.sleep(0.005)
    elif action == "count":
        with open(os.path.join(arg, f"{name}.count"), "a") as f:
            f.write("1\n")


configure(os.environ.get("CASMON_FAULTPOINTS"))
