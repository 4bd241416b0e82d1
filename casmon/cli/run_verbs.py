"""The run verbs: ``runs``, ``show RUN``, ``diff A B``, ``restore RUN TARGET`` and ``export RUN TARGET``."""

from __future__ import annotations

import json
import os
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from casmon.cli.options import (console, err_console, load_or_say, one_line, open_store, store_option, timestamp,
                                trust_option, trusted, value_text)
from casmon.errors import CasmonError
from casmon.view.progress import progress_phases
from casmon.view.text import did_you_mean, plural, short_repr, size


def _load_run(which, store_location):
    from casmon.runs import load_run

    try:
        return load_run(which, open_store(store_location, read_only=True))
    except (LookupError, CasmonError) as e:
        raise click.ClickException(one_line(e)) from None


#: Metric columns ``casmon runs`` shows unless ``--columns`` names its own.
DEFAULT_METRIC_COLUMNS = 6
_STATUS_STYLE = {"ok": "green", "failed": "red", "killed": "magenta", "lost": "yellow", "running": "cyan"}


def _number(v) -> str:
    """A number in a table or a line: NaN and infinities said as such (a diverged run is no blank)."""
    from casmon.runs.metrics import number_text

    return number_text(v)


def _either(cell: dict, side: str, absent: str, present: bool | None = None) -> str:
    """One side of a difference: its value's repr, or ``(not set)`` where that run has none (not a stored None)."""
    if present is None:
        present = cell.get(side) is not None
    return (_nonfinite(cell[side]) or repr(cell[side])) if present else f"({absent})"


def _nonfinite(v) -> str | None:
    """NaN and infinities as metrics say them (`NaN`, `inf`), not Python's `nan`; None for anything else."""
    import math

    return _number(v) if isinstance(v, float) and not math.isfinite(v) else None


def _pairs(kind: str, v: dict) -> dict:
    """Packages arrive as ``{name: {"a", "b"}}``, environments as ``{"a": {...}, "b": {...}}``: both as the first."""
    if kind == "packages":
        return v
    a, b = (x if isinstance(x, dict) else {} for x in (v.get("a"), v.get("b")))  # a crafted manifest's env: no dict
    return {n: {"a": a.get(n), "b": b.get(n)} for n in set(a) | set(b) if a.get(n) != b.get(n)}


def _json(v) -> str:
    """JSON as the run verbs print it: NaN and infinities as "NaN", "Infinity", "-Infinity" (JSON has none)."""
    from casmon.runs.metrics import json_safe

    return json.dumps(json_safe(v), indent=2, default=str)


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _columns_of(r) -> dict:
    """A run's values by column name, ``info.X``, ``param.X`` and ``metric.X`` (a metric's last value)."""
    from casmon.runs.params import flatten

    out: dict = {}
    if r.error is not None:
        return out
    for k, v in flatten({k: v for k, v in r.manifest.get("info", {}).items()}).items():
        out[f"info.{k}"] = v
    for k, v in r.flat_params().items():
        out[f"param.{k}"] = v
    for k, v in r.metric_summary().items():
        out[f"metric.{k}"] = v.get("last")
    return out


def _column_name(name: str, known: set) -> str:
    """A ``--columns`` name as a prefixed one: ``loss`` is ``metric.loss`` if only a metric has it."""
    if name in known:
        return name
    matches = [f"{g}.{name}" for g in ("metric", "param", "info") if f"{g}.{name}" in known]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise click.ClickException(f"--columns: {name!r} is {' and '.join(matches)}: name one of them")
    bare = sorted({k.split(".", 1)[1] for k in known})
    hint = did_you_mean(name, known if "." in name else bare)
    raise click.ClickException(f"--columns: no run has {name!r}{f' ({hint})' if hint else ''}; "
                               f"known: {', '.join(bare[:40]) or 'none'}")


@click.command()
@store_option
@click.option("--json", "as_json", is_flag=True,
              help="Print the runs as a JSON list (name, ref, status, start, elapsed, commit, dirty, params, metrics).")
@click.option("--columns", default=None, metavar="NAMES",
              help="Comma-separated metrics, params (cfg.lr) or info entries to show as columns "
                   f"(default: the first {DEFAULT_METRIC_COLUMNS} metrics).")
@click.option("--tag", "tags", multiple=True, metavar="TAG",
              help="Only the runs tagged TAG (given again: tagged with every one).")
@trust_option
def runs(store_location, as_json, columns, tags, trust) -> None:
    """Recorded runs: number, comment, time, status, commit, dirty, and the latest value of each metric."""
    from casmon.runs import list_runs
    from casmon.runs.tags import check_tag

    try:
        wanted = {check_tag(t, "--tag") for t in tags}
    except (TypeError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    all_runs = list_runs(open_store(store_location, read_only=True))
    if wanted:
        all_runs = [r for r in all_runs if wanted <= set(r.tags)]
    if as_json:
        click.echo(_json([{"name": r.name, "ref": r.ref, "status": r.status, "start": r.manifest.get("start"),
                                "elapsed": r.elapsed, "heartbeat": r.heartbeat, "signal": r.manifest.get("signal"),
                                "resumes": len(r.resumes),
                                "commit": r.manifest.get("git", {}).get("commit"), "dirty": r.manifest.get("git", {}).get("dirty"),
                                "notebook": r.manifest.get("notebook"), "tags": list(r.tags), "note": r.note,
                                "params": r.flat_params() if r.error is None else {},
                                "metrics": r.metric_summary()}
                               for r in all_runs]))
        return
    if not all_runs:
        console.print(f"no runs tagged {' and '.join(sorted(wanted))}" if wanted else "no runs recorded", markup=False)
        return
    values = {r.ref: _columns_of(r) for r in all_runs}
    if columns is not None:
        known = set().union(*values.values())
        extra = [_column_name(c.strip(), known) for c in columns.split(",") if c.strip()]
    else:
        from casmon.runs.sysmetrics import users_first

        names = users_first(set().union(*(r.metric_summary() for r in all_runs)))  # sys/ ones last
        extra = [f"metric.{n}" for n in names[:DEFAULT_METRIC_COLUMNS]]
    t = Table(title="runs")
    notebooks = any(r.manifest.get("notebook") for r in all_runs)  # a column only where some run came from one
    tagged = any(r.tags for r in all_runs)
    for col in (("run", "comment", "started", "duration", "status", "commit", "dirty") + (("notebook",) if notebooks else ())
                + (("tags",) if tagged else ())):
        t.add_column(col)
    bare = [c.split(".", 1)[1] for c in extra]
    for col, name in zip(extra, bare):
        t.add_column(escape(name if bare.count(name) == 1 else col), justify="right")
    for r in all_runs:
        m = r.manifest
        g_ = m.get("git")
        g: dict = g_ if isinstance(g_, dict) else {}  # a crafted manifest's fields are any JSON
        st = r.status
        status = f"[{_STATUS_STYLE[st]}]{st}[/{_STATUS_STYLE[st]}]" if st in _STATUS_STYLE else escape(str(st))
        if st == "killed" and m.get("signal"):
            status += escape(f" ({m['signal']})")
        if r.resumes:
            status += escape(f", resumed {len(r.resumes)}x")
        el = r.elapsed
        dur = "" if el is None else f"{el:.1f} s" + ("…" if st == "running" else "")
        t.add_row(escape(str(r.name)), escape(str(m.get("comment") or "")), timestamp(m["start"]) if m.get("start") else "", dur, status,
                  (g.get("commit") or "")[:10] or ("no git" if not g.get("in_git") else "no commit"),
                  "yes" if g.get("dirty") else "",
                  *([escape(os.path.basename(m.get("notebook") or ""))] if notebooks else []),  # `show` has the path
                  *([escape(_cut(" ".join(r.tags), 40))] if tagged else []),
                  *[escape(short_repr(values[r.ref][c], 24) if not isinstance(values[r.ref].get(c), (int, float, type(None)))
                           else _number(values[r.ref].get(c))) for c in extra])
    console.print(t)


#: How many names an error lists before it says how many more there are.
LISTED_NAMES = 20


def _names(names: list[str], what: str, newest: bool = False) -> str:
    """``logged functions: a, b`` (at most LISTED_NAMES of them: the first, or the ``newest``, and how many more)."""
    if not names:
        return f"no {what}"
    if len(names) <= LISTED_NAMES:
        return f"{what}: {', '.join(names)}"
    rest = f"{len(names) - LISTED_NAMES:,}"
    if newest:
        return f"{what}: {rest} earlier, {', '.join(names[-LISTED_NAMES:])}"
    return f"{what}: {', '.join(names[:LISTED_NAMES])} and {rest} more"


def _not_a_run(which: str, store) -> str:
    """Why `casmon show WHICH` found no run: WHICH may be a logged function whose call number was left out, a
    short name several logged functions share, or neither (then what there is)."""
    from casmon.calllog import CallLog, ranges_text
    from casmon.runs import list_runs

    log = CallLog(store)
    # The names CallLog.resolve takes for WHICH: the full name, or one ending in `.WHICH`.
    matches = [f for f in log.functions if f == which or f.endswith("." + which)]
    if len(matches) > 1 and which not in log.functions:
        return (f"{which!r} is ambiguous: {', '.join(matches)} (and no run is named so); "
                f"name a call with `casmon show FULL_NAME N`, e.g. `casmon show {matches[0]} N`")
    if not matches:
        cached = _cached_function(store, which)
        if cached:
            return (f"no run or logged function {which!r}, but {which!r} is a cached function ({cached}): "
                    f"`casmon cache {cached}` shows its versions and entries")
        runs = [r.name for r in list_runs(store)]
        runs_text = _names(runs, "runs", newest=True) if runs else "no runs recorded"
        hint = did_you_mean(which, [*(["latest"] if runs else []), *runs, *log.functions])
        return (f"no function or run named {which!r}{f' ({hint})' if hint else ''}; {runs_text}; "
                f"{_names(list(log.functions), 'logged functions')}")
    full = log.resolve(which)
    fi = log.functions[full]
    latest = max(fi.sessions) if fi.sessions else None
    calls = ranges_text(sorted(c.n for c in fi.sessions[latest])) if latest is not None else "none"
    return (f"no run {which!r}, but {which!r} is a logged function ({full}; calls {calls} in session {latest}): "
            f"name a call with `casmon show {which} N` (and --session S for another session)")


def _cached_function(store, which: str) -> str | None:
    """The cached function WHICH names (full or short name), or None: `casmon show` is for runs and logged calls."""
    from casmon.caching import cache_entries, resolve_function

    try:
        return resolve_function(cache_entries(store), which)
    except (LookupError, CasmonError):
        return None


def _info(r) -> dict:
    """The run's info as `show` prints it: described, or with --trust loaded one by one, so that a value whose
    code cannot load (its module is not here) is one line saying so among the others."""
    if not trusted():
        return r.info_peek()
    from casmon.runs.manifest import is_value_ref
    from casmon.store.peek import as_digest, describe

    def load(k: str, h: str) -> Any:
        return load_or_say(lambda: r.store.get(as_digest(h, f"run {r.name}: info {k}")), lambda: describe(r.store, h, 80))

    return {k: load(k, v["$"]) if is_value_ref(v) else v for k, v in r.manifest.get("info", {}).items()}


def _artifact_list(r: Any) -> list[dict[str, Any]]:
    from casmon.runs.artifacts import read_artifacts

    try:
        arts = read_artifacts(r.store, r.ref).values()
    except CasmonError:
        return []
    return [{"name": a.name, "kind": a.kind, "size": a.size, "digest": a.digest, "step": a.step} for a in arts]


def _artifacts(r: Any, most: int = 10) -> None:
    """`casmon show`'s short list of what the run saved: its artifacts, then its checkpoints' steps."""
    from casmon.runs.artifacts import read_artifacts

    try:
        arts = list(read_artifacts(r.store, r.ref).values())
    except CasmonError as e:
        console.print(f"  artifacts: cannot be read ({one_line(e)})", markup=False)
        return
    named = [a for a in arts if a.kind != "checkpoint"]
    steps = sorted(a.step for a in arts if a.kind == "checkpoint" and a.step is not None)
    if named:
        console.print(f"  artifacts ({len(named)}, {size(sum(a.size for a in named))}):", markup=False)
        for a in named[:most]:
            files = f", {plural(a.files, 'file')}" if a.files is not None else ""
            console.print(f"    {a.name}: {a.kind}{files}, {size(a.size)}", markup=False)
        if len(named) > most:
            console.print(f"    ... and {len(named) - most} more: `casmon artifacts {r.name}`", markup=False)
    if steps:
        shown = ", ".join(map(str, steps[-most:]))
        console.print(f"  checkpoints ({len(steps)}): steps {'..., ' if len(steps) > most else ''}{shown}", markup=False)


def show_run(which: str, store_location: str | None, as_json: bool = False) -> None:
    """`casmon show RUN`: what a run recorded (called by `show`, which also shows logged calls)."""
    from casmon.runs import load_run

    store = open_store(store_location, read_only=True)
    try:
        r = load_run(which, store)
    except LookupError:
        raise click.ClickException(_not_a_run(which, store)) from None
    except CasmonError as e:
        raise click.ClickException(one_line(e)) from None
    m = r.manifest
    g = m.get("git", {})
    if as_json:
        if r.error is not None:
            raise click.ClickException(one_line(r.error))
        click.echo(_json({"name": r.name, "ref": r.ref, "status": r.status, "digest": r.digest, "elapsed": r.elapsed,
                          "heartbeat": r.heartbeat, "params": r.flat_params(), "metrics": r.metric_summary(),
                          "tags": list(r.tags), "note": r.note, "edits": r.edits(),
                          "artifacts": _artifact_list(r), "manifest": m}))
        return
    console.print(f"[bold]run {escape(str(r.name))}[/bold]  {escape(str(r.status))}  manifest {r.digest[:12]}")
    if r.error is not None:
        console.print(f"  cannot read this run: {one_line(r.error)}", markup=False)
        return
    if m.get("start"):
        el = r.elapsed
        how = (f", took {el:.2f} s" if m.get("duration") is not None else
               f", running for {el:.1f} s" if r.status == "running" and el is not None else
               f", last heard of {el:.1f} s after" if el is not None else "")
        console.print(f"  started {timestamp(m['start'])}{how}")
    if r.resumes:
        console.print(f"  resumed {plural(len(r.resumes), 'time')}:", markup=False)
        for when in r.resumes[-20:]:
            console.print(f"    {timestamp(when['time'])} on {when['host']} by pid {when['pid']}, after it was "
                          f"{when['status']}",
                          markup=False)
    console.print(f"  {m.get('user')}@{m.get('host')}, Python {m.get('python')}, pid {m.get('pid')}", markup=False)
    if r.tags:
        console.print(f"  tags: {' '.join(r.tags)}", markup=False)
    if r.note:
        console.print(f"  run note: {r.note}", markup=False)
    if isinstance(m.get("parent"), str):
        console.print(f"  nested in run {m['parent'].split('/', 1)[-1]}", markup=False)
    if m.get("notebook"):  # a kernel's command line names only a temporary connection file
        console.print(f"  notebook: {m['notebook']}", markup=False)
    else:
        console.print(f"  command: {' '.join(m.get('argv', []))}", markup=False)
    if g.get("in_git"):
        console.print(f"  git: {g.get('root')} commit {(g.get('commit') or 'none')[:12]} on {g.get('branch') or 'detached HEAD'}"
                      f"{', uncommitted changes (' + str(len(r.patch())) + ' byte patch)' if g.get('dirty') else ', clean'}", markup=False)
        if g.get("untracked"):
            console.print(f"  untracked files in the patch: {', '.join(g['untracked'][:10])}", markup=False)
    for note in g.get("notes", []):
        console.print(f"  note: {note}", markup=False)
    for path, f in m.get("files", {}).items():
        console.print(f"  tracked {path} ({size(f['size'])}, {f['digest'][:12]})", markup=False)
    for k, v in r.flat_params().items():
        console.print(f"  param {k} = {_nonfinite(v) or short_repr(v, 120, arrays=True, qualified=True)}", markup=False)
    for k, v in _info(r).items():
        console.print(f"  info {k} = {value_text(v, 120)}", markup=False, soft_wrap=True)  # a reason is one line
    summary = r.metric_summary()
    if summary:
        console.print(f"  metrics ({len(summary)}):")
        for k, v in summary.items():
            console.print(f"    {k}: last {_number(v.get('last'))} at step {_number(v.get('step'))}, "
                          f"{plural(int(v.get('n') or 0), 'point')}, min {_number(v.get('min'))}, "
                          f"max {_number(v.get('max'))}", markup=False)
    _artifacts(r)
    _links(m.get("links"))
    if r.status == "killed":
        console.print(f"  killed by {m.get('signal') or 'a signal'}" + (
            f" at {timestamp(m['signal_time'])}" if m.get("signal_time") else ""), markup=False)
    elif r.status == "lost":
        console.print(f"  lost: no heartbeat since {timestamp(r.heartbeat)} (killed, out of memory, or its node died)"
                      if r.heartbeat else "  lost", markup=False)
    if m.get("status") == "failed":
        console.print(m.get("traceback", ""), markup=False)
    out = r.output()
    if out:
        tail = out[-2000:]
        console.print(f"  output ({'so far, ' if not m.get('output') else ''}{len(out):,} characters{', last 2,000' if len(out) > 2000 else ''}):")
        console.print(tail, markup=False)


def _links(links) -> None:
    """The cache entries a run hit or filled, per function, and its call-log sessions (as the UI's run page)."""
    links = links if isinstance(links, dict) else {}
    per_fn: dict[str, list[int]] = {}
    for x in links.get("cache") or []:
        if isinstance(x, dict) and isinstance(x.get("fn"), str):
            per_fn.setdefault(x["fn"], [0, 0])[1 if x.get("hit") else 0] += 1
    for fn, (stored, hits) in sorted(per_fn.items()):
        console.print(f"  cache {fn}: {stored} stored, {plural(hits, 'hit')} (`casmon cache {fn}`)", markup=False)
    for sess in [x for x in links.get("call_sessions") or [] if type(x) is int]:
        console.print(f"  calls: session {sess} (`casmon calls --session {sess}`)", markup=False)


@click.command("diff")
@click.argument("a")
@click.argument("b")
@store_option
@click.option("--json", "as_json", is_flag=True, help="Print the differences as JSON (stored values described, not loaded).")
@trust_option
def diff_cmd(a, b, store_location, as_json, trust) -> None:
    """What differs between runs A and B: code, tracked files, metadata, info, results."""
    from casmon.runs import diff

    ra, rb = _load_run(a, store_location), _load_run(b, store_location)
    d = diff(ra, rb)
    first = _first_difference(ra, rb)
    if first is not None:
        d["lineage"] = first.to_dict()["first_difference"]
    if as_json:
        click.echo(_json(d))
        return
    console.print(f"[bold]{escape(str(d['a']))}[/bold] vs [bold]{escape(str(d['b']))}[/bold]" + ("  (identical records)" if d["same_manifest"] else ""))
    c = d["commit"]
    console.print(f"  commit: {'same' if c['same'] else (c['a'] or 'none')[:12] + ' -> ' + (c['b'] or 'none')[:12]}")
    console.print(f"  uncommitted changes: {'same' if d['patch']['same'] else 'differ'}")
    if not d["patch"]["same"] and d["patch"].get("diff"):
        console.print(d["patch"]["diff"][:4000], markup=False)
    for kind in ("added", "removed", "changed"):
        for p in d["files"][kind]:
            console.print(f"  tracked file {kind}: {p}", markup=False)
    for k, v in d["meta"].items():
        if k in ("packages", "env"):  # one line per package or variable that differs
            word = "package" if k == "packages" else "env"
            for name, ab in sorted(_pairs(k, v).items()):
                console.print(f"  {word} {name}: {_either(ab, 'a', 'not installed' if word == 'package' else 'not set')}"
                              f" -> {_either(ab, 'b', 'not installed' if word == 'package' else 'not set')}", markup=False)
            continue
        console.print(f"  {k}: {v['a']!r} -> {v['b']!r}", markup=False)
    pa, pb = ra.flat_params(), rb.flat_params()
    for k, v in d.get("params", {}).items():
        console.print(f"  param {k}: {_either(v, 'a', 'not set', k in pa)} -> {_either(v, 'b', 'not set', k in pb)}",
                      markup=False)
    for k, v in d.get("metrics", {}).items():
        last = [_number(v[s]) if v["n"][i] is not None else "(not logged)" for i, s in enumerate("ab")]
        points = " -> ".join(str(n or 0) for n in v["n"])
        console.print(f"  metric {k}: last {last[0]} -> {last[1]} ({points} points)", markup=False)
    ia, ib = ra.manifest.get("info", {}), rb.manifest.get("info", {})
    for k, v in d["info"].items():
        how = f"  ({v['how']})" if v.get("how") else ""
        console.print(f"  info {k}: {_either(v, 'a', 'not set', k in ia)} -> {_either(v, 'b', 'not set', k in ib)}{how}",
                      markup=False)
    for r in d["results"]:
        console.print(f"  [yellow]{escape(str(r['function']))}[/yellow] returned different results for the same inputs ({plural(r['calls'], 'call')}, via {r['via']})")
    if first:
        console.print("  " + str(first).replace("\n", "\n  "), markup=False, soft_wrap=True)


def _first_difference(ra, rb):
    """Where the runs' lineages part (casmon.lineage), or None where the records cannot say."""
    from casmon.lineage import first_difference

    try:
        return first_difference(ra, rb, ra.store)
    except (LookupError, CasmonError) as e:
        err_console.print(f"first difference in lineage: not known ({one_line(e)})", markup=False)
        return None


@click.command("restore")
@click.argument("run")
@click.argument("target", type=click.Path(file_okay=False))
@store_option
@click.option("--repo", type=click.Path(exists=True, file_okay=False), help="The git repository holding the run's commit.")
@click.option("--artifacts", "with_artifacts", is_flag=True,
              help="Also write the run's artifacts (artifacts/, artifacts.json), as export does.")
@trust_option
def restore_cmd(run, target, store_location, repo, with_artifacts, trust) -> None:
    """Write RUN's code into TARGET: its commit, its uncommitted changes, its tracked files."""
    from casmon.runs import restore

    r = _load_run(run, store_location)
    try:
        root = restore(r, target, repo=repo, artifacts=with_artifacts)
    except (CasmonError, OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    console.print(f"restored run {r.name} into {root}", markup=False)


@click.command("export")
@click.argument("items", nargs=-1, metavar="RUN TARGET | --zarr OUT [RUN | FN | ENTRY ...]")
@click.option("--zarr", "zarr_out", metavar="OUT",
              help="Write the store (or the runs, cached functions and entry keys named) as a zarr v3 hierarchy "
                   "at OUT: a new folder, a .zip file or an s3:// prefix, opened by any zarr reader without casmon.")
@store_option
@trust_option
def export_cmd(items, zarr_out, store_location, trust) -> None:
    """Write RUN as a plain folder: information.json, current_changes.patch, console.log, tracked files, artifacts;
    with --zarr OUT, the store (or the runs, functions and entries named) as a zarr v3 hierarchy."""
    if zarr_out is not None:
        _export_zarr(zarr_out, items, store_location)
        return
    if len(items) != 2:
        raise click.UsageError("export takes RUN TARGET (or --zarr OUT [RUN | FN | ENTRY ...])")
    from casmon.runs import export

    run, target = items
    r = _load_run(run, store_location)
    try:
        with progress_phases(True, err_console) as progress:
            root = export(r, target, progress=progress)
    except (CasmonError, OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    console.print(f"exported run {r.name} into {root}", markup=False)


def _export_zarr(out: str, items: tuple[str, ...], store_location) -> None:
    from casmon.store.libraries import import_view_libraries
    from casmon.store.zarrexport import ExportError

    import_view_libraries()  # this process has imported no library: frames and datasets would export described
    s = open_store(store_location, read_only=True)
    try:
        try:
            done = s.export_zarr(out, *items)
        except ExportError:
            # A run may be named as the other verbs name it (a number, `latest`): resolved, then exported by name.
            named = tuple(_load_run(i, store_location).name if i == "latest" or i.lstrip("-").isdigit() else i
                          for i in items)
            if named == items:
                raise
            done = s.export_zarr(out, *named)
    except (CasmonError, OSError, ValueError) as e:
        raise click.ClickException(one_line(e)) from None
    console.print(f"exported {done.arrays} arrays and {done.groups} groups ({done.nbytes:,} bytes) as zarr into "
                  f"{done.url}" + (f"; {done.linked} equal chunks hard-linked" if done.linked else ""), markup=False)
