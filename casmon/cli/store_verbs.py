"""The verbs that look after a store as a whole: ``stats``, ``verify`` (``--repair``) and ``gc``.

``gc`` also evicts cache entries (``--max-size``, ``--older-than``) and drops
duplicate ones before it marks what is reachable, so that their results go
with the same gc.
"""

from __future__ import annotations

import json
import sys

import click
from rich.table import Table

from casmon.cli.options import console, err_console, open_store, say, store_option, trust_option
from casmon.errors import MAX_BYTES, CasmonError, checked_number
from casmon.view.progress import progress_phases
from casmon.view.text import plural, size


@click.command()
@store_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@trust_option
def stats(store_location, as_json, trust) -> None:
    """Values, chunks, bytes, dedup ratio and files of a store."""
    store = open_store(store_location, read_only=True)
    with progress_phases(not as_json, err_console) as progress:
        s = store.stats(progress)
    if as_json:
        click.echo(json.dumps(s, indent=2))
        return
    t = Table(title=f"casmon store {s['store']}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value", justify="right")
    t.add_row("values", f"{s['values']:,}")
    t.add_row("chunks", f"{s['chunks']:,}  ({s['loose_objects']:,} loose, {plural(s['packs'], 'pack')})")
    t.add_row("logical bytes", size(s["logical_bytes"]))
    t.add_row("after dedup", size(s["chunk_bytes"]) + f"  (dedup {s['dedup_ratio']:.2f}x, chunks compressed "
              f"{s['compression_ratio']:.2f}x)")
    reserve = s.get("reserve_bytes", 0)
    t.add_row("stored bytes", size(s["stored_bytes"])
              + (f"  ({size(reserve)} of it the gc reserve, room for gc on a full disk)" if reserve else ""))
    t.add_row("files", f"{s['files']:,}  " + ", ".join(f"{a} {n}" for a, n in s["files_by_area"].items()))
    for kind, n in s["records"].items():
        t.add_row(f"records: {kind}", f"{n:,}")
    t.add_row("refs", f"{s['refs']:,}")
    console.print(t)


@click.command()
@store_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a report.")
@click.option("--repair", is_flag=True, help="Drop what cannot be trusted (damaged objects, and what needs them).")
@trust_option
def verify(store_location, as_json, repair, trust) -> None:
    """Re-hash every object and follow every pointer. Exit status 1 if anything is wrong."""
    store = open_store(store_location, read_only=not repair)
    with progress_phases(not as_json, err_console) as progress:
        rep = store.verify(progress)
        if repair and not rep.ok:
            from casmon.maintenance import repair as do_repair

            try:
                done = do_repair(store, progress)
            except CasmonError as e:
                raise click.ClickException(str(e)) from None
            if not as_json:
                console.print(f"[yellow]repaired[/yellow]: deleted {plural(len(done['deleted_files']), 'file')}, dropped "
                              f"{plural(done['dropped_index_entries'], 'object')}, {plural(done['dropped_records'], 'record')}, "
                              f"{plural(len(done['dropped_refs']), 'ref')}")
            rep = store.verify(progress)
    if as_json:
        click.echo(json.dumps(rep.as_dict(), indent=2))
    else:
        checked = ", ".join(plural(n, what[:-1] if what.endswith("s") else what, what) for what, n in rep.checked.items())
        console.print(f"checked {checked}")
        for key, reason in rep.damaged:
            console.print(f"[red]damaged[/red] {key}: {reason}")
            for dep in rep.affected.get(key, []):
                console.print(f"    needed by {dep}")
        for what, needed_by in rep.missing:
            console.print(f"[red]missing[/red] {what}, needed by {needed_by}")
        console.print("[green]store is sound[/green]" if rep.ok else f"[red]{len(rep.damaged):,} damaged, {len(rep.missing):,} missing[/red]")
    sys.exit(0 if rep.ok else 1)


def _parse_size(text: str | None) -> int | None:
    if text is None:
        return None
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b?)\s*", text.lower())
    if not m:
        raise click.BadParameter(f"{text!r} is not a size; write e.g. 500M, 10G, 1.5GiB", param_hint="--max-size")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2)]
    return int(checked_option(float(m.group(1)) * mult, "--max-size", text, high=MAX_BYTES, unit="bytes"))


def _parse_age(text: str | None) -> float | None:
    if text is None:
        return None
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smhdw]?)\s*", text.lower())
    if not m:
        raise click.BadParameter(f"{text!r} is not an age; write e.g. 3600s, 90m, 12h, 30d, 2w", param_hint="--older-than")
    return checked_option(float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)],
                          "--older-than", text)


def checked_option(value: float, option: str, given: object, **limits) -> float:
    """``value`` (what ``option`` was ``given`` as) if finite and within ``limits`` (:func:`checked_number`'s), else a
    usage error naming the option."""
    try:
        return checked_number(value, option, **limits)
    except ValueError as e:
        shown = str(given) if len(str(given)) <= 40 else str(given)[:37] + "..."
        need = str(e).rsplit(", got ", 1)[0].removeprefix(option + " ")
        raise click.BadParameter(f"{need}, got {shown}", param_hint=option) from None


def duplicates_freed(store, dups: dict) -> int:
    """The bytes dropping duplicate cache records frees: the values they hold that no kept record holds, each once
    (two processes that computed one key alike stored one value)."""
    from casmon.caching import KIND as CACHE_KIND, result_of
    from casmon.errors import DamagedObjectError
    from casmon.store.records import parse_record

    held: set[str] = set()
    dropped: dict[str, int] = {}
    for k, v in store.table(CACHE_KIND).items():
        k, v = bytes(k), bytes(v)
        try:
            r = parse_record(CACHE_KIND, k, v)  # bounded: a crafted record is skipped, never a RecursionError
            d = result_of(k, r) if isinstance(r, dict) else None
        except (ValueError, TypeError, DamagedObjectError):
            continue
        if d is None:
            continue
        if (k, v) in dups:
            dropped[d] = dups[(k, v)][1]
        else:
            held.add(d)
    return sum(n for d, n in dropped.items() if d not in held)


def eviction_lines(plan: dict) -> list[str]:
    """Per function: the entries a plan drops and the bytes of the values that frees, each value once; values
    that entries of other functions hold too are marked shared, and values a kept entry holds (freeing nothing)
    are counted apart."""
    fns: dict[str, str] = {}  # value -> the one function whose dropped entries hold it, or "" for several
    for e in plan.values():
        fns[e.value] = e.fn if fns.get(e.value, e.fn) == e.fn else ""
    per_fn: dict[str, tuple[list[int], dict[str, int]]] = {}
    for e in plan.values():
        counts, values = per_fn.setdefault(e.fn, ([0, 0], {}))
        counts[0] += 1
        if e.stays:
            counts[1] += 1
        else:
            values[e.value] = e.size
    lines = []
    for fn, ((n, stay), values) in sorted(per_fn.items()):
        shared = sum(nb for v, nb in values.items() if not fns[v])
        what = size(sum(values.values())) + (f", {size(shared)} of it shared with another function (counted once "
                                             "above)" if shared else "")
        if stay == n:
            what = "frees nothing: a kept entry, a run or a call log holds the same result"
        elif stay:
            what += f"; {stay:,} of them free nothing: a kept entry holds the same result"
        lines.append(f"  {fn}: {plural(n, 'entry', 'entries')} ({what})")
    return lines


@click.command()
@store_option
@click.option("--max-size", metavar="SIZE", help="Evict least recently used cache entries until their results total at most SIZE (e.g. 10G).")
@click.option("--older-than", metavar="AGE", help="Evict cache entries not used for AGE (e.g. 30d, 12h).")
@click.option("--grace", type=float, default=3600.0, show_default=True, metavar="SECONDS",
              help="Delete only what an earlier gc condemned (published as unreachable) at least this long ago; "
                   "at least 60.")
@click.option("--now", is_flag=True, help="Delete unreachable objects at once (only while nothing else writes); "
                                          "not with --grace.")
@click.option("--dry-run", is_flag=True, help="Report exactly what this gc would evict, remove, condemn and repack; change nothing.")
@click.option("--break-lock", is_flag=True, help="Take the store lock from a gc or repair that died on another machine.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (evicted and deleted counts and bytes).")
@trust_option
@click.pass_context
def gc(ctx, store_location, max_size, older_than, grace, now, dry_run, break_lock, as_json, trust) -> None:
    """Remove objects no record or ref reaches, and repack sparse packs.

    An unreachable object is first condemned (published for writers to see) and
    removed by a later gc at least --grace seconds after, if still unreachable.
    With --max-size or --older-than, first evict cache entries (least recently used first).
    """
    from casmon.caching import eviction_plan, evict, freed_bytes
    from casmon.store.condemned import MIN_GRACE
    from casmon.maintenance import gc as run_gc

    if now and ctx.get_parameter_source("grace") is not click.core.ParameterSource.DEFAULT:
        raise click.UsageError("--now deletes at once and --grace waits: give one of them, not both")
    if not now and grace < MIN_GRACE:
        raise click.BadParameter(f"--grace must be at least {MIN_GRACE:g} seconds (writers rely on it); "
                                 f"--now deletes at once when nothing else writes to the store", param_hint="--grace")
    checked_option(grace, "--grace", f"{grace:g}")
    max_bytes = _parse_size(max_size)
    max_age = _parse_age(older_than)
    # gc never needs to unpickle, --trust or not; and it never creates a store where there is none.
    store = open_store(store_location, trust=False, create=False)
    evicting = max_bytes is not None or max_age is not None
    # Entries of functions `casmon cache clear` forgot are dropped by every gc (with no limits, evict drops just
    # those), so that their results become unreachable; the dry run plans the same and reports it.
    if not dry_run and not store.backend.supports_deletes:
        raise click.ClickException(f"cannot gc {store.url}: it cannot delete (a zip file); "
                                   f"`casmon gc --dry-run` shows what gc would remove")
    from casmon.caching import drop_duplicates, superseded_entries

    # Records of keys a newer record holds: two processes missed one key at once, or a refresh replaced them.
    dups, replaced_records = superseded_entries(store)
    replaced = len(replaced_records)
    deduped = (len(dups), duplicates_freed(store, dups))
    if dups and not dry_run:
        deduped, dups = (drop_duplicates(store, dups)[0], deduped[1]), {}
    if not dry_run:  # runs killed or lost before their end compacted their metric batches (runs.compaction)
        from casmon.runs.compaction import compact_runs

        compact_runs(store)
    from casmon.runs.artifacts import KIND_ARTIFACT, drop_superseded, superseded_plan

    # Artifact records a newer one of their run and name replaced or released (checkpoint retention).
    superseded = superseded_plan(store)
    n_superseded = len(superseded)
    if superseded and not dry_run:
        drop_superseded(store, superseded)
        superseded = {}
    plan: dict = eviction_plan(store, max_size=max_bytes, older_than=max_age)
    evicted = (len(plan), freed_bytes(plan))
    if plan and not dry_run:
        evicted = evict(store, plan=plan)
        shown, plan = plan, {}  # the real gc marks without the dropped entries: they are gone
    else:
        shown = plan
    from casmon.caching import KIND as CACHE_KIND

    # Entries evicted or dropped above are gone from the records gc reads; the dry run marks without them.
    dropped: set[bytes | tuple[bytes, float]] = set(plan)
    dropped |= {(k, t) for (k, _v), (_fn, _s, t) in dups.items()}
    with progress_phases(not as_json, err_console) as progress:
        try:
            rep = run_gc(store, grace=0.0 if now else grace, dry_run=dry_run, progress=progress, break_lock=break_lock,
                         without=({CACHE_KIND: dropped} if plan or dups else {})
                         | ({KIND_ARTIFACT: set(superseded.values())} if superseded else {}) or None)
        finally:
            store.close()
    if as_json:
        d = rep.as_dict()
        d["evicted_entries"], d["evicted_bytes"] = evicted
        d["duplicate_entries"], d["duplicate_bytes"] = deduped[0] - replaced, deduped[1]
        d["replaced_entries"] = replaced
        d["released_artifacts"] = n_superseded
        click.echo(json.dumps(d, indent=2))
        return
    if deduped[0]:
        racing = deduped[0] - replaced
        parts = [plural(racing, "duplicate cache entry", "duplicate cache entries")] if racing else []
        if replaced:
            parts.append(plural(replaced, "cache entry a refresh replaced", "cache entries a refresh replaced"))
        console.print(f"{'would drop' if dry_run else 'dropped'} {' and '.join(parts)} "
                      f"({size(deduped[1])} of results; every call keeps its newest entry)")
    if n_superseded:
        say(f"{'would drop' if dry_run else 'dropped'} {plural(n_superseded, 'artifact record')} a newer save or a "
            f"checkpoint's release replaced (each run keeps its newest artifact of each name)")
    if evicted[0] or evicting:
        verb = "would drop" if dry_run else "dropped"
        # Bytes are of the values no kept entry holds, each counted once: entries that share a value free it together.
        say(f"{verb} {plural(evicted[0], 'cache entry', 'cache entries')} ({size(evicted[1])} of results)")
        if shown:
            for line in eviction_lines(shown):
                say(line, markup=False)
    verb = "would remove" if dry_run else "removed"
    say(
        f"{plural(rep.live_values, 'live value')}; {plural(rep.unreachable, 'unreachable object')}; {verb} "
        f"{plural(rep.deleted_objects, 'object')} ({size(rep.deleted_bytes)}), "
        f"{'would repack' if dry_run else 'repacked'} {plural(rep.repacked_packs, 'pack')}"
    )
    if rep.condemned:
        say(f"{'would condemn' if dry_run else 'condemned'} {plural(rep.condemned, 'newly unreachable object')}: "
            f"a gc at least {grace:.0f} s from now removes {'it if it is' if rep.condemned == 1 else 'them if they are'} "
            f"still unreachable")
    if rep.recent_values:
        say(f"{plural(rep.recent_values, 'unreachable value')} {'was' if rep.recent_values == 1 else 'were'} put within "
            f"the last day and nothing names {'it' if rep.recent_values == 1 else 'them'}: gc "
            f"removes such values (a value put with `store.put` alone is one). Keep a value with a run (`run.save(name, value)`) or a ref "
            f"(`store.set_ref(name, digest)`)", markup=False)
    if rep.waiting > rep.condemned:
        waiting = rep.waiting - rep.condemned
        say(f"{plural(waiting, 'condemned object')} {'waits for its' if waiting == 1 else 'wait for their'} grace period "
            f"(a later gc removes {'it' if waiting == 1 else 'them'}; --now at once)")
