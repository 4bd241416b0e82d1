"""``casmon demo``: the main job on the default store, in a minute (the verb and what it runs)."""

from __future__ import annotations

import time
import warnings

import click
import numpy as np
from rich.console import Console
from rich.table import Table

from casmon.caching import cache
from casmon.cli.options import console as cli_console, creating_store_option, trust_option
from casmon.errors import CasmonError
from casmon.view.text import size
from casmon.calllog import CallLog, intercept
from casmon.runs import RunWarning, list_runs, record
from casmon.store.store import Store, open as open_store


def preprocess(raw: np.ndarray, bins: int = 64) -> np.ndarray:
    """The demo's "expensive" step: a histogram per row, plus a pause standing in for real work."""
    time.sleep(0.3)
    lo, hi = float(raw.min()), float(raw.max())
    edges = np.linspace(lo, hi, bins + 1)
    return np.stack([np.histogram(row, edges)[0] for row in raw[:512]])


def train_step(weights: np.ndarray, lr: float = 0.1, momentum: float = 0.9) -> float:
    """The demo's logged function: one "training step" returning a loss."""
    return float(np.mean((weights * lr) ** 2) + momentum * 0.001)


def run_demo(location=None, console: Console | None = None) -> None:
    console = console or Console()
    store = open_store(location)
    console.print(f"[bold]casmon demo[/bold] on store [cyan]{store.url}[/cyan]\n")
    before = store.stats()["stored_bytes"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RunWarning)  # e.g. "not a git repository": the table below says so
        with record(comment="demo", store=store, capture_output=False) as run:
            ok = _steps(store, console, run.info)
    s = store.stats()
    console.print(
        f"\nstore now holds {s['values']} values in {s['chunks']} chunks: {size(s['logical_bytes'], 'MiB')} of values, "
        f"{size(s['stored_bytes'], 'MiB')} on disk (this demo added {size(s['stored_bytes'] - before, 'MiB')}), {s['files']} files"
    )
    console.print(f"casmon.record kept this demo as run [bold]{run.name}[/bold]; the latest runs:")
    t = Table()
    for col in ("run", "started", "duration", "status", "commit", "dirty"):
        t.add_column(col)
    for r in list_runs(store)[-5:]:
        g = r.manifest.get("git", {})
        t.add_row(r.name, time.strftime("%H:%M:%S", time.localtime(r.manifest.get("start", 0))),
                  f"{r.manifest.get('duration', 0):.1f} s", r.status,
                  (g.get("commit") or ("no git" if not g.get("in_git") else "none"))[:10], "yes" if g.get("dirty") else "")
    console.print(t)
    console.print(f"try: [bold]casmon runs[/bold], [bold]casmon show {run.name}[/bold], [bold]casmon stats[/bold], "
                  "[bold]casmon cache[/bold], [bold]casmon calls[/bold], [bold]casmon show casmon.demo.train_step 2[/bold], "
                  "[bold]casmon verify[/bold], [bold]casmon gc --dry-run[/bold]", soft_wrap=True)  # commands stay whole
    store.close()
    if not ok:
        raise SystemExit(1)


def _steps(store, console: Console, run_info: dict) -> bool:
    rng = np.random.default_rng(42)
    data = rng.integers(0, 1000, size=(4096, 1024)).astype(np.float64)  # 32 MiB
    edited = data.copy()
    edited[2000, 5] = -1.0
    values = [
        ("a 32 MiB float64 array", data),
        ("the same array again", data.copy()),
        ("the array with one element changed", edited),
        ("a config dict", {"lr": 0.01, "layers": [64, 64], "name": "demo"}),
        ("a tuple with an array inside", ("features", data[:10])),
    ]
    t = Table(title="store.put(value)")
    for col in ("value", "digest", "chunks", "new chunks", "put time"):
        t.add_column(col)
    known: set = set()
    digests = []
    for label, v in values:
        t0 = time.perf_counter()
        d = store.put(v)
        dt = time.perf_counter() - t0
        m = store.manifest(d)
        chunks = list(m.chunk_digests())
        new = [c for c in chunks if c not in known]
        known.update(chunks)
        digests.append(d)
        t.add_row(label, d.short, str(len(chunks)), str(len(new)), f"{dt * 1000:.1f} ms")
    for (label, _), d in zip(values, digests):
        # A ref keeps each value reachable, so `casmon gc` leaves the demo's values alone.
        store.set_ref("demo/" + label.replace(" ", "-"), d)
    store.flush()
    console.print(t)

    ok = True
    for (label, v), d in zip(values, digests):
        back = store.get(d)
        same = np.array_equal(back, v) if isinstance(v, np.ndarray) else (
            back[0] == v[0] and np.array_equal(back[1], v[1]) if isinstance(v, tuple) else back == v)
        ok &= bool(same)
    console.print(f"reloaded {len(values)} values: {'[green]all equal to what went in[/green]' if ok else '[red]MISMATCH[/red]'}")

    lazy = store.open_array(digests[0])
    row = lazy[2000]
    console.print(f"lazy zarr view of the array: shape {lazy.shape}, row 2000 read through {lazy.store.chunks_read} chunk(s), equal: {np.array_equal(row, data[2000])}")

    cached = cache(store=store)(preprocess)
    t = Table(title="@casmon.cache")
    for col in ("call", "result", "time"):
        t.add_column(col)
    for label, arg in (("preprocess(data)", data), ("preprocess(data) again", data), ("preprocess(edited)", edited),
                       ("preprocess(data, bins=64)", data)):
        t0 = time.perf_counter()
        out = cached(arg, bins=64) if "bins" in label else cached(arg)
        dt = time.perf_counter() - t0
        t.add_row(label, f"{out.shape} {out.dtype}", f"{dt * 1000:.1f} ms")
    console.print(t)
    info = cached.cache_info()
    console.print(f"cache_info: {info.hits} hits, {info.misses} misses this run, {info.entries} entries stored "
                  "(run the demo again: every call is a hit)\n")

    logged = intercept(store=store)(train_step)
    w = data[:64].copy()
    losses = []
    for step in range(3):
        losses.append(logged(w, lr=0.1 / (step + 1)))
        w *= 0.5  # the function's input changes after each call; the log keeps what each call saw
    store.flush()
    # Which record answers "call 2 of session N" is the store's choice: read the log without trusting
    # its pickles (the demo's own arguments are arrays and floats), and replay only train_step itself.
    log = CallLog(Store(store.backend, trust=False, autoflush=None))  # same backend, a second view
    name = log.resolve("casmon.demo.train_step")
    session = logged.__casmon_intercept__.recorder().session  # this process's own session
    args = vars(log.get_args(name, 2, session=session))  # parameter name -> value
    console.print(f"@casmon.intercept logged {len(log.calls(name, session=session))} calls of train_step in session {session}; "
                  f"call 2 read back: lr={args['lr']}, momentum={args['momentum']} (default), weights {args['weights'].shape}, "
                  f"equal to what it saw: {np.array_equal(args['weights'], data[:64] * 0.5)}")
    r = log.replay(name, 2, session=session, fn=train_step)
    run_info["loss"] = losses[-1]  # what `casmon runs`, `casmon diff` and `casmon ui` compare across runs
    run_info["losses"] = losses
    console.print(f"replayed call 2: {'same result' if r.matches else 'DIFFERENT result'} ({r.result:.6f})\n")

    return ok


@click.command()
@creating_store_option
@trust_option
def demo(store_location: str | None, trust: bool) -> None:
    """Store and reload a few values; show deduplication and the store's stats."""
    try:
        run_demo(store_location, cli_console)
    except CasmonError as e:
        raise click.ClickException(str(e)) from None
