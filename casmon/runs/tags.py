"""Tags and notes of runs: checked tags, and every change after a run's start kept as an edit record.

A run's manifest holds the tags it started with (``record(tags=...)``), and an ended run's manifest is
written once. So each later change (``run.tags.add`` while it goes on, ``casmon tag`` and ``casmon note``
after its end) is one record of kind :data:`KIND_RUNEDIT` under the run's ref: ``{run, time, who, add,
remove}`` or ``{run, time, who, note}``. Records are appended, never rewritten: two editors at once both
land, and a reader applies every edit oldest first (its time, then its content) to the manifest's tags;
the newest note is the note, and the edits stay readable as the run's history (:func:`history`). An edit
names no stored value, so gc has nothing of it to keep; ``delete_run`` removes the edits with the run.
Times come from each editor's clock: edits made at the same moment on two hosts whose clocks disagree
apply in their clocks' order.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator, MutableSet
from typing import TYPE_CHECKING, Any

from casmon.errors import CasmonError, DamagedObjectError, warn_damage
from casmon.keys.fingerprint import fingerprint
from casmon.store.records import parse_record

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["KIND_RUNEDIT", "MAX_TAG", "MAX_TAGS", "MAX_NOTE", "check_tag", "check_tags", "edit_key", "append_edit",
           "read_edits", "edits_by_run", "merged", "history", "RunTags", "tag_run", "note_run"]

KIND_RUNEDIT = "runedit"
#: Longest tag (characters), most tags one run keeps, longest note (characters).
MAX_TAG = 100
MAX_TAGS = 1000
MAX_NOTE = 100_000

_clock_lock = threading.Lock()
_last_time = 0.0


def _fresh_lock_in_child() -> None:
    """A forked child's clock lock is free: another thread of the parent may have held it at the fork."""
    global _clock_lock
    _clock_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_lock_in_child)


def check_tag(tag: Any, where: str) -> str:
    """``tag`` if it is one (a non-empty string of at most :data:`MAX_TAG` printable characters, no whitespace
    or comma, not starting with ``+`` or ``-``, which ``casmon tag`` reads as add and remove); else a one-line
    error naming it."""
    if not isinstance(tag, str):
        raise TypeError(f"{where}: a tag is a string, got {type(tag).__name__}")
    if not tag:
        raise ValueError(f"{where}: a tag may not be empty")
    if len(tag) > MAX_TAG:
        raise ValueError(f"{where}: tag {tag[:40]!r}... is {len(tag)} characters long; at most {MAX_TAG}")
    if any(c.isspace() or c == "," for c in tag):
        raise ValueError(f"{where}: tag {tag[:80]!r} holds whitespace or a comma; a tag is one word "
                         f"(use '-' or '_' between words)")
    if not tag.isprintable():
        raise ValueError(f"{where}: tag {tag[:80]!r} holds a control character")
    if tag[0] in "+-":
        raise ValueError(f"{where}: tag {tag[:80]!r} starts with {tag[0]!r}, which `casmon tag` reads as add/remove")
    return tag


def check_tags(tags: Any, where: str) -> tuple[str, ...]:
    """Tags given as one string or an iterable of strings: checked, sorted, each once."""
    if tags is None:
        return ()
    if isinstance(tags, str):
        tags = [tags]
    try:
        items = list(tags)
    except TypeError:
        raise TypeError(f"{where}: tags must be a list of strings, got {type(tags).__name__}") from None
    out = tuple(sorted({check_tag(t, where) for t in items}))
    if len(out) > MAX_TAGS:
        raise ValueError(f"{where}: {len(out)} tags; a run keeps at most {MAX_TAGS}")
    return out


def check_note(text: Any, where: str) -> str:
    if not isinstance(text, str):
        raise TypeError(f"{where}: a note is a string, got {type(text).__name__}")
    if len(text) > MAX_NOTE:
        raise ValueError(f"{where}: the note is {len(text):,} characters long; at most {MAX_NOTE:,}")
    return text


def edit_key(ref: str) -> bytes:
    """The key every edit record of run ``ref`` is appended under."""
    return bytes(fingerprint(("casmon.runedit", ref)))


def _clock() -> float:
    """The time, rising strictly within this process: two edits in one clock tick keep their order."""
    global _last_time
    with _clock_lock:
        _last_time = max(time.time(), _last_time + 1e-6)
        return _last_time


def _who() -> str:
    from casmon.runs.environment import user

    return f"{user()}@{socket.gethostname()}"


def append_edit(store: Store, ref: str, start: Any, *, add: Iterable[str] = (), remove: Iterable[str] = (),
                note: str | None = None) -> dict[str, Any]:
    """Append one edit of run ``ref``, which started at ``start`` (visible to others at the store's next flush);
    the record."""
    rec: dict[str, Any] = {"run": ref, "start": start, "time": _clock(), "who": _who(), "pid": os.getpid()}
    if note is not None:
        rec["note"] = note
    else:
        rec["add"], rec["remove"] = sorted(add), sorted(remove)
    store.append(KIND_RUNEDIT, rec, key=edit_key(ref))
    return rec


def _invalid(rec: Any, ref: str) -> str | None:
    """Why ``rec`` is no edit of run ``ref`` as casmon writes one (a crafted or damaged record); None if it is."""
    if not isinstance(rec, dict):
        return "not an object"
    if rec.get("run") != ref:
        return f"it names run {str(rec.get('run'))[:80]!r}, stored under run {ref!r}'s key"
    t = rec.get("time")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0 <= t < 1e11:
        return f"its time {str(t)[:40]!r} is not a time"
    if "note" in rec:
        note = rec["note"]
        if not isinstance(note, str) or len(note) > MAX_NOTE:
            return f"its note is not text of at most {MAX_NOTE:,} characters"
        return None
    if not all(isinstance(rec.get(k), list) and len(rec[k]) <= MAX_TAGS for k in ("add", "remove")):
        return f"its add and remove are not lists of at most {MAX_TAGS} tags"
    return None


def _passed_over(store: Store, ref: Any, rec: Any) -> bool:
    """True (with a one-line warning) if ``rec`` is to be left out: readers never raise on a crafted edit."""
    why = _invalid(rec, ref) if isinstance(ref, str) else "it names no run"
    if why is not None:
        warn_damage(store.url, f"an edit of run {str(ref)[:80]!r}'s tags or note", f"passed over: {why}")
    return why is not None


def _order(rec: dict[str, Any]) -> tuple[float, str]:
    return float(rec["time"]), json.dumps(rec, sort_keys=True, default=str)


def read_edits(store: Store, ref: str) -> list[dict[str, Any]]:
    """Run ``ref``'s edits, oldest first (none if the store has none, or they cannot be read); a malformed or
    crafted edit is passed over with a warning, and hides no other."""
    if KIND_RUNEDIT not in store.record_kinds():
        return []
    key = edit_key(ref)
    recs = []
    try:
        for v in store.table(KIND_RUNEDIT).lookup(key):
            try:
                recs.append(parse_record(KIND_RUNEDIT, key, v))
            except DamagedObjectError as e:  # one malformed edit hides no other (verify names it)
                warn_damage(store.url, e.key, e.reason)
    except (CasmonError, OSError):  # the table cannot be read: the manifest's tags (verify names the damage)
        return []
    return sorted((r for r in recs if not _passed_over(store, ref, r)), key=_order)


def edits_by_run(store: Store) -> dict[str, list[dict[str, Any]]]:
    """Every run's edits, oldest first, in one read of the table (``list_runs`` reads them so)."""
    out: dict[str, list[dict[str, Any]]] = {}
    try:
        if KIND_RUNEDIT not in store.record_kinds():
            return out
        for key, rec in store.records(KIND_RUNEDIT, strict=False):
            ref = rec.get("run") if isinstance(rec, dict) else None
            if isinstance(ref, str) and bytes(key) != edit_key(ref):
                warn_damage(store.url, f"an edit stored under key {bytes(key).hex()}",
                            f"passed over: it names run {ref[:80]!r}, whose edits are under another key")
            elif not _passed_over(store, ref, rec) and isinstance(ref, str):
                out.setdefault(ref, []).append(rec)
    except (CasmonError, OSError):
        return {}
    for recs in out.values():
        recs.sort(key=_order)
    return out


def _of_this_run(manifest: dict[str, Any], edits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The edits of the run this manifest is: an edit a deletion raced past names the start of the run
    before, whose freed number a new run may have claimed."""
    start = manifest.get("start")
    return [e for e in edits if e.get("start") is None or start is None or e.get("start") == start]


def merged(manifest: dict[str, Any], edits: list[dict[str, Any]]) -> tuple[tuple[str, ...], str]:
    """``(tags, note)``: the manifest's tags with every edit applied in order, and the newest note ("" if none).
    A crafted manifest's or edit's odd tags are left out."""
    edits = _of_this_run(manifest, edits)
    start = manifest.get("tags")
    tags = {t for t in start if _is_tag(t)} if isinstance(start, list) else set()
    note = ""
    for e in edits:
        if "note" in e:
            note = e["note"]
            continue
        tags |= {t for t in e["add"] if _is_tag(t)}
        tags -= set(x for x in e["remove"] if isinstance(x, str))
    return tuple(sorted(tags)), note


def _is_tag(t: Any) -> bool:
    try:
        check_tag(t, "")
        return True
    except (TypeError, ValueError):
        return False


def history(manifest: dict[str, Any], edits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each change of the run's tags and note, oldest first: ``time``, ``who``, and ``add``/``remove`` or
    ``note``; the tags it started with first (its start's time, ``who`` its user and host)."""
    out = []
    edits = _of_this_run(manifest, edits)
    start = manifest.get("tags")
    if isinstance(start, list) and start:
        out.append({"time": manifest.get("start"), "who": f"{manifest.get('user')}@{manifest.get('host')}",
                    "add": [t for t in start if _is_tag(t)], "remove": []})
    for e in edits:
        item = {"time": float(e["time"]), "who": str(e.get("who", "?"))}
        if "note" in e:
            item["note"] = e["note"]
        else:
            item["add"] = [t for t in e["add"] if _is_tag(t)]
            item["remove"] = [t for t in e["remove"] if isinstance(t, str)]
        out.append(item)
    return out


class RunTags(MutableSet):
    """A run's tags while this process records it: ``add`` and ``discard`` are kept at once (in the manifest
    before the run is in the store, as edits once it is). A change first reads the edits made elsewhere
    (``casmon tag``), so it is never taken as done already on a stale view; reading ``run.tags`` shows this
    process's view, ``load_run(...).tags`` merges them all."""

    def __init__(self, run: Any, tags: Iterable[str]) -> None:
        self._run = run
        self._tags = set(tags)
        self._lock = threading.Lock()

    def __contains__(self, tag: object) -> bool:
        return tag in self._tags

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._tags))

    def __len__(self) -> int:
        return len(self._tags)

    def __repr__(self) -> str:
        return f"RunTags({sorted(self._tags)!r})"

    def add(self, tag: str) -> None:
        self._change([check_tag(tag, f"run {self._run.name}: tags.add")], [])

    def discard(self, tag: str) -> None:
        if isinstance(tag, str):
            self._change([], [tag])

    def replace(self, tags: Iterable[str]) -> None:
        """Make the tags exactly ``tags`` (``run.tags = [...]``)."""
        self._change(list(check_tags(tags, f"run {self._run.name}: tags")), [], exactly=True)

    def _stored(self) -> None:
        """Once the run is in the store: the tags there, with every edit made elsewhere since."""
        run = self._run
        if not (run._started and run.ref and run.store is not None):
            return
        try:
            if KIND_RUNEDIT in run.store.record_kinds():
                run.store.table(KIND_RUNEDIT).refresh()  # another process's edit since this one's last look
            self._tags = set(merged(run.manifest, read_edits(run.store, run.ref))[0])
        except (CasmonError, OSError):
            pass  # the store is away: this process's view

    def _change(self, add: list[str], remove: list[str], exactly: bool = False) -> None:
        run = self._run
        if run._pid != os.getpid():
            raise CasmonError(f"casmon: run {run.name}: tags are changed by the process that records the run "
                              f"(process {run._pid}), not by its child {os.getpid()}")
        with self._lock:
            self._stored()
            if exactly:
                add, remove = sorted(set(add) - self._tags), sorted(self._tags - set(add))
            add = [t for t in add if t not in self._tags]
            remove = [t for t in remove if t in self._tags]
            if not add and not remove:
                return
            if len(self._tags) + len(add) > MAX_TAGS:
                raise ValueError(f"run {run.name}: a run keeps at most {MAX_TAGS} tags")
            with run._saving:  # the run's start is written now or not: the manifest, or an edit record
                edited = bool(run._started and run.ref)
                if edited:
                    append_edit(run.store, run.ref, run.manifest.get("start"), add=add, remove=remove)
                else:
                    run.manifest["tags"] = sorted((self._tags | set(add)) - set(remove))
            self._tags |= set(add)
            self._tags -= set(remove)
        if edited and run.store.autoflush is not None:  # autoflush=None: the user flushes
            try:
                run.store.flush()  # readers see it now, not at the run's next write
            except (CasmonError, OSError):
                pass  # the record waits in memory for the next flush


def _resolve(run: Any, store: Any) -> tuple[Store, str, Any]:
    from casmon.runs.listing import load_run
    from casmon.store.store import default_store

    s = default_store(store if store is not None else getattr(run, "store", None))
    if s.read_only:
        raise CasmonError(f"casmon: cannot change a run's tags or note in {s.url}: it is opened read-only")
    which = getattr(run, "ref", None) or run
    if not isinstance(which, (str, int)):
        raise TypeError(f"casmon: give a run's name or number, a RunInfo or a Run, got {type(run).__name__}")
    info = load_run(which, s)
    if info.manifest.get("status") == "claimed" or not s.get_ref(info.ref):
        raise CasmonError(f"casmon: run {info.name} has not started writing yet; tag it once it has")
    return s, info.ref, info.manifest.get("start")


def tag_run(run: Any, add: Iterable[str] = (), remove: Iterable[str] = (), store: Any = None) -> tuple[str, ...]:
    """Add and remove tags of ``run`` (a name, number, ``latest``, RunInfo or Run), ended or not; its tags now."""
    add_t = check_tags(add, "casmon tag")
    remove_t = check_tags(remove, "casmon tag")
    both = set(add_t) & set(remove_t)
    if both:
        raise ValueError(f"casmon tag: {sorted(both)[0]!r} is both added and removed")
    s, ref, start = _resolve(run, store)
    if add_t or remove_t:
        append_edit(s, ref, start, add=add_t, remove=remove_t)
        s.flush()
    from casmon.runs.listing import load_run

    return load_run(ref, s).tags


def note_run(run: Any, text: str, store: Any = None) -> None:
    """Set ``run``'s note to ``text`` ("" clears it), ended or not; the notes before stay in its history."""
    check_note(text, "casmon note")
    s, ref, start = _resolve(run, store)
    append_edit(s, ref, start, note=text)
    s.flush()
