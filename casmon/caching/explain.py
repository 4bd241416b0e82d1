"""Why a call missed: what differs between it and the nearest stored entries of its function.

A key is one digest; to tell *which* part of it differs, each entry also
records a short digest of every parameter (``"a"``) and the files it read
(``"files"``), and each code version of a function records its parts once
(``cachefn`` records): a digest and the source text of the function and of
every helper it reaches, a digest of every global it reads, the library
functions it names. :func:`explain_call` compares a call with every live entry
of its function and reports the nearest ones; :func:`explain_entry` does the
same for a stored entry (``casmon ui``'s cache page), and :func:`code_versions`
lists a function's versions with what changed between them (``casmon cache NAME``).
"""

from __future__ import annotations

import base64
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import xxhash

from casmon.caching.binder import VAR_KEYWORD, VAR_POSITIONAL
from casmon.caching.edges import CONTENT_MIN
from casmon.caching.entries import KIND, KIND_CLEAR, KIND_FN, name_digest, newest_per_key
from casmon.keys.codeversion import VersionedFingerprinter
from casmon.keys.digest import Digest

if TYPE_CHECKING:
    from casmon.caching.memoize import CacheState
    from casmon.store.store import Store

__all__ = ["Difference", "Explanation", "Version", "relabel", "arg_digests", "span_digest", "legacy_digests",
           "same_value", "entry_alt", "MIXED", "version_parts", "explain_call", "explain_entry", "code_versions",
           "compare_parts", "main_hint", "short_digest", "file_changed", "code_change_message"]

#: A parameter whose value holds more bytes than this gets no digest of its own (the miss would hash it twice).
ARG_DIGEST_MAX = 64 << 20
#: ``*args`` items and ``**kwargs`` keys given digests of their own (the rest count as the parameter's last).
ITEMS_MAX = 1000
#: Source text kept per function of a version, and in all (longer texts are compared by digest alone).
TEXT_MAX = 64 << 10
TEXTS_MAX = 256 << 10
NEAREST = 3
#: How many entries of a function explain reads at most (the newest first).
ENTRIES_READ_MAX = 200_000


_hex64 = xxhash.xxh3_64_hexdigest
_h128 = xxhash.xxh3_128_hexdigest


def _short(d: Digest | bytes) -> str:
    return base64.b64encode(bytes(d)[:8]).decode().rstrip("=")


def arg_digests(state: CacheState, args: tuple, kwargs: dict, spans: Any = None) -> dict[str, str]:
    """A digest of each parameter of a call as its key counts it (``ignore=`` left out, ``hashers=`` applied;
    ``*args`` as ``name[i]``, ``**kwargs`` by their own names). ``spans``: the key's encoding and each parameter's
    part of it (:meth:`CacheState.key_ctx`), so a plain parameter is not hashed again; one that fed a large buffer
    to the hasher is ``"~"`` (no digest kept: hashing it twice would double the miss). A parameter whose span is
    content-sized (:func:`span_digest`) gets lineage's 128-bit content digest, which its ``pc`` reuses: each span
    is hashed once."""
    out: dict[str, str] = {}
    by_span: dict[str, tuple[int | None, int]] = {}
    raw = None
    if spans is not None:
        raw, parts = spans
        nlen = state._name_lens
        if state._simple and not state.files:  # every parameter is one span: no second look at the arguments
            mv = memoryview(raw)
            hashers = state.hashers
            for n, a, b in parts:  # span_digest, inline: this is every miss
                if a is None:
                    out[n] = "~"
                    continue
                v = a + nlen.get(n, b)  # a name it does not know (code reassigned meanwhile): the 64-bit one
                out[n] = _h128(mv[v:b]) if b - v >= CONTENT_MIN and not (hashers and n in hashers) else _hex64(mv[a:b])
            return out
        by_span = {n: (a, b) for n, a, b in parts}
    try:
        vals = state.bind(args, kwargs)
    except TypeError:
        return out
    for p, v in zip(state.params, vals):
        if p.name in state.ignore:
            continue
        if (p.kind not in (VAR_KEYWORD, VAR_POSITIONAL) and p.name in by_span
                and p.name not in state.files):  # a files= parameter's key holds the content: its path counts here
            a, b = by_span[p.name]
            out[p.name] = "~" if raw is None else span_digest(memoryview(raw), a, b, nlen.get(p.name, 0),
                                                              p.name not in state.hashers)
            continue
        items: list[tuple[str, Any]]
        if p.kind == VAR_KEYWORD:
            items = [(str(k), x) for k, x in v.items()]
        elif p.kind == VAR_POSITIONAL:
            items = [(f"{p.name}[{i}]", x) for i, x in enumerate(v)]
        else:
            items = [(p.name, v)]
        for name, x in items[:ITEMS_MAX]:
            try:
                if p.name in state.hashers:
                    x = state.hashers[p.name](x)
                nb = getattr(x, "nbytes", 0)
                if isinstance(nb, int) and nb > ARG_DIGEST_MAX:
                    out[name] = "~"
                    continue
                fp = VersionedFingerprinter()
                fp.feed_value(x, name)
                out[name] = _short(fp.digest())
            except Exception:  # noqa: BLE001 - the key itself said what it could not hash
                continue
    return out


def span_digest(mv: Any, a: int | None, b: int, nlen: int, content: bool) -> str:
    """A parameter's digest from its span ``mv[a:b]`` of the key's encoding (its name's ``nlen`` bytes first):
    where the value's part is content-sized (:data:`~casmon.caching.edges.CONTENT_MIN` bytes or more, and
    ``content``: not a ``hashers=``/``files=`` parameter's), the 128-bit digest of that part, which lineage
    records as the parameter's content digest (``pc``); else the 64-bit digest of the whole span, the form an
    older casmon gave every parameter (so its entries' short parameters compare as they are)."""
    if a is None:
        return "~"
    v = a + nlen
    if content and b - v >= CONTENT_MIN:
        return _h128(mv[v:b])
    return _hex64(mv[a:b])


#: Lengths of a parameter's recorded digest: a span's 64-bit one, with the name (every span's, in an older
#: casmon's entries); a content digest, 128-bit (its ``pc``). A ``*args`` item's is neither.
OLD_SPAN, CONTENT_SPAN = 16, 32
#: An entry that records no lineage field (stored before lineage: this casmon's record at least an empty ``pc``)
#: cannot tell a short value's 64-bit digest from an older casmon's of a long value.
MIXED = ("may differ: one side records it by content, the other by a 64-bit digest they cannot be compared "
         "through (a short value's, or an older casmon's)")


def legacy_digests(state: CacheState, spans: Any, now: dict[str, str]) -> dict[str, str]:
    """For each parameter of ``now`` (a call's :func:`arg_digests`) whose digest is a content digest, the digest
    an older casmon recorded: compared with an entry it stored (explain's slow path only)."""
    if spans is None:
        return {}
    raw, parts = spans
    mv = memoryview(raw)
    return {n: _hex64(mv[a:b]) for n, a, b in parts
            if a is not None and len(now.get(n) or "") == CONTENT_SPAN}


def same_value(x: str, y: str, x_alt: dict[str, str] | None, y_alt: dict[str, str] | None, name: str) -> bool | None:
    """Whether two recorded digests ``x`` and ``y`` of parameter ``name`` are of one value, where one may be an
    older casmon's 64-bit digest and the other a content digest. ``*_alt``: that side's digests in the other form
    (a call's :func:`legacy_digests`; an entry's ``pc``; None for an entry stored before lineage, which has
    none). None where nothing tells."""
    if x == y:
        return True
    if {len(x), len(y)} != {OLD_SPAN, CONTENT_SPAN}:
        return False
    old, new, old_alt, new_alt = (x, y, x_alt, y_alt) if len(x) == OLD_SPAN else (y, x, y_alt, x_alt)
    mine = new_alt.get(name) if new_alt else None
    if type(mine) is str and len(mine) == OLD_SPAN:  # a call's digest as an older casmon took it
        return mine == old
    if old_alt is None:
        return None
    d = old_alt.get(name)
    # an older entry records the content digest of every content-sized parameter: without one, its value was short
    return d == new


def version_parts(parts: list[Any] | None, pinned: str | None = None,
                  sources: dict[str, str] | None = None) -> dict[str, Any]:
    """What a code version is made of, for its ``cachefn`` record: ``code`` (function or class -> digest),
    ``text`` (function -> source, when short), ``globals`` (name -> digest), ``libs`` (name -> what it names)."""
    if pinned is not None:
        return {"pinned": pinned}
    code: dict[str, str] = {}
    text: dict[str, str] = {}
    glob: dict[str, str] = {}
    libs: dict[str, str] = {}
    total = 0
    for p in parts or ():
        if not isinstance(p, tuple) or not p:
            continue
        tag = p[0]
        if tag == "fn" and len(p) == 3:
            name, body = str(p[1]), p[2]
            fp = VersionedFingerprinter()
            fp.feed(("fn", body))
            code[name] = _short(fp.digest())
            src = (sources or {}).get(name)
            if src is not None and len(src) <= TEXT_MAX and total + len(src) <= TEXTS_MAX:
                text[name] = src
                total += len(src)
        elif tag == "class" and len(p) == 4:
            fp = VersionedFingerprinter()
            fp.feed(("class", list(p[2]), p[3]))
            code[f"class {p[1]}"] = _short(fp.digest())
        elif tag == "global" and len(p) == 3:
            v = p[2]
            glob[str(p[1])] = v if isinstance(v, str) else _short(bytes(v))
        elif tag in ("lib", "module") and len(p) == 3:
            libs[str(p[1])] = str(p[2])
    return {"code": code, "text": text, "globals": glob, "libs": libs}


@dataclass
class Difference:
    """One thing that differs: ``what`` is ``parameter``, ``code``, ``global``, ``library``, ``file``, ``key``;
    ``diff`` a unified diff of the source when both versions' text is known."""

    what: str
    name: str
    detail: str
    diff: str = ""

    def __str__(self) -> str:
        head = f"{self.what} {self.name!r}: {self.detail}" if self.name else f"{self.what}: {self.detail}"
        return head + ("\n" + self.diff.rstrip("\n") if self.diff else "")

    def clause(self) -> str:
        """In words, for a sentence: ``parameter 'seed' differs``, ``the default values changed``."""
        if self.what == "defaults":
            return f"the default values {self.detail}"
        if self.what == "file":  # its details are clauses of their own: "its content changed", "not read then"
            return f"file {self.name!r}: {self.detail}"
        return f"{self.what} {self.name!r} {self.detail}" if self.name else f"{self.what} {self.detail}"


@dataclass
class Nearest:
    """A stored entry and what differs between it and the call (or entry) explained."""

    key: str
    time: float
    differences: list[Difference]


@dataclass
class Explanation:
    """The answer of ``f.explain(...)``: ``hit``, or the nearest stored entries and what differs from each."""

    fn: str
    hit: bool
    nearest: list[Nearest] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    entries: int = 0
    #: Where entries of the same function are under its other name (``__main__.f`` / ``train.f``), if any.
    elsewhere: str = ""

    @property
    def differences(self) -> list[Difference]:
        """What differs from the nearest entry (empty for a hit)."""
        return self.nearest[0].differences if self.nearest else []

    def __bool__(self) -> bool:
        return self.hit

    def why(self) -> str:
        """The reason in one line (what ``f.lookup`` raises): this call's own entry's notes, what differs from the
        nearest entry, then entries under the function's other name."""
        if self.hit:
            return "it is stored"
        # This call's own entry first (cleared, expired), then what differs from the nearest entry, and only
        # then entries under the function's other name: they are a guess, the rest is what was found.
        said = [n.removeprefix("note: ") for n in self.notes]
        if self.nearest:
            diffs = self.nearest[0].differences
            what = "; ".join(d.clause() for d in diffs[:4])
            more = f" and {len(diffs) - 4} more" if len(diffs) > 4 else ""
            said.append(f"against the nearest stored entry, {what}{more} (`f.explain(...)` shows more).")
        elif not said:
            said.append("no entry of this function is stored.")
        if self.elsewhere:
            said.append("Also: " + self.elsewhere.removeprefix("note: "))
        return " ".join(said)

    def __str__(self) -> str:
        if self.hit:
            lines = [f"{self.fn}: hit (this call's result is stored)"]
        elif not self.nearest:
            lines = [f"{self.fn}: miss; no stored entry to compare with"]
        else:
            of = "its one stored entry" if self.entries == 1 else f"the nearest of its {self.entries:,} stored entries"
            lines = [f"{self.fn}: miss. What differs from {of}:"]
            shown: set[str] = set()
            for i, n in enumerate(self.nearest):
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(n.time))
                lines.append(f"  entry {n.key[:12]} (stored {when}):")
                for d in n.differences:
                    if d.diff and d.diff in shown:  # the same source diff once
                        lines.append(f"    {d.what} {d.name!r}: {d.detail} (the diff above)")
                        continue
                    shown.add(d.diff)
                    lines.extend("    " + line for line in str(d).splitlines())
                if i == 0 and len(self.nearest) > 1:
                    lines.append("  next nearest:")
            if self.entries > len(self.nearest):
                lines.append(f"  ({self.entries - len(self.nearest):,} entries further away not shown)")
        lines.extend(self.notes)
        if self.elsewhere:
            lines.append(self.elsewhere)
        return "\n".join(lines)

    __repr__ = __str__


@dataclass
class Version:
    """One code version of a function, as its ``cachefn`` record holds it."""

    version: str
    time: float
    parts: dict[str, Any] | None
    changes: list[Difference] = field(default_factory=list)  # against the version before it (in time)


@dataclass
class _Side:
    """What a call or an entry is made of, as far as it is recorded."""

    args: dict[str, str] | None
    files: dict[tuple[str, str], str]
    version: str | None
    parts: dict[str, Any] | None
    #: parameter digests in the other form (:func:`same_value`): an entry's ``pc``, a call's legacy ones
    alt: dict[str, str] | None = None


def short_digest(d: str) -> str:
    """A file's content digest as lineage prints it (its first 8 hex digits); a crafted one that is not hex,
    quoted (no control bytes)."""
    return d[:8] if d and not d[:8].strip("0123456789abcdef") else ascii(d[:8])


def file_changed(was: str, now: str) -> str:
    """How explain and ``stale`` say a file read with content ``was`` holds ``now``."""
    return f"its content changed: was {short_digest(was)}, now {short_digest(now)}"


def _files_of(listing: Any) -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    for f in listing or ():
        if isinstance(f, (list, tuple)) and len(f) >= 3:
            out[(str(f[0]), str(f[1]))] = str(f[2])
    return out


def _versions(store: Store, fn: str) -> dict[str, dict[str, Any]]:
    """Version hex -> its parts, from the function's ``cachefn`` records that hold them."""
    out: dict[str, tuple[float, dict[str, Any]]] = {}
    for r in store.lookup(KIND_FN, name_digest(fn)):
        v, parts = r.get("version"), r.get("parts")
        if isinstance(v, str) and isinstance(parts, dict):
            t = r.get("time", 0.0)
            if v not in out or t > out[v][0]:
                out[v] = (t, parts)
    return {v: p for v, (_t, p) in out.items()}


def _diff_text(name: str, old: str, new: str) -> str:
    old, new = old[:TEXT_MAX], new[:TEXT_MAX]  # a crafted record's text is as long as its writer liked
    import difflib  # only an explanation that shows a change of source needs it

    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), f"{name} (stored)", f"{name} (now)", lineterm="", n=1)
    return "\n".join(list(lines)[:80])


def relabel(diff: str, name: str, old: str, new: str) -> str:
    """A source diff of explain's with its two header lines naming its sides ``old`` and ``new`` (explain says
    ``(stored)`` and ``(now)``, the sides of a call; two runs' entries are the sides of a run's diff)."""
    lines = diff.split("\n")
    if len(lines) >= 2 and lines[0] == f"--- {name} (stored)" and lines[1] == f"+++ {name} (now)":
        lines[:2] = [f"--- {name} ({old})", f"+++ {name} ({new})"]
    return "\n".join(lines)


def _part_group(parts: dict[str, Any], name: str) -> dict[str, Any]:
    g = parts.get(name)
    return g if isinstance(g, dict) else {}  # a malformed record (crafted, damaged) names nothing


def compare_parts(old: dict[str, Any], new: dict[str, Any]) -> list[Difference]:
    """What differs between two versions' parts (as :func:`version_parts` makes them)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return [Difference("code", "", "the version differs (a version record is not readable)")]
    out: list[Difference] = []
    if "pinned" in old or "pinned" in new:
        if old.get("pinned") != new.get("pinned"):
            out.append(Difference("code", "version", f"pinned {str(old.get('pinned'))[:80]!r} then, "
                                                     f"{str(new.get('pinned'))[:80]!r} now"))
        return out
    for group, what in (("code", "code"), ("globals", "global"), ("libs", "library")):
        a, b = _part_group(old, group), _part_group(new, group)
        for name in sorted(set(a) | set(b), key=str):
            if a.get(name) == b.get(name):
                continue
            kind = what
            if what == "global" and name == "<defaults>":
                kind, name = "defaults", ""
            if name not in a and kind == what:
                detail = "added (not used by the stored version)"
            elif name not in b and kind == what:
                detail = "no longer used"
            elif what == "library":
                detail = f"was {a[name]}, now {b[name]}"
            else:
                detail = "changed"
            diff = ""
            if what == "code":
                ta, tb = _part_group(old, "text").get(name), _part_group(new, "text").get(name)
                if isinstance(ta, str) and isinstance(tb, str):
                    diff = _diff_text(str(name), ta, tb)
            out.append(Difference(kind, str(name), detail, diff))
    return out


def _compare(now: _Side, then: _Side, versions: dict[str, dict[str, Any]]) -> list[Difference]:
    out: list[Difference] = []
    if then.args is None or now.args is None:
        out.append(Difference("parameter", "", "unknown: the stored entry does not record its parameters "
                                              "(stored by an older casmon)"))
    else:
        maybe = []
        for name in sorted(set(now.args) | set(then.args)):
            a, b = then.args.get(name), now.args.get(name)
            if a == "~" or b == "~":
                maybe.append((name, "may differ: a large value, of which no digest is kept"))
                continue
            if a == b:
                continue
            if a is not None and b is not None:
                same = same_value(a, b, then.alt, now.alt, name)
                if same:
                    continue
                if same is None:
                    maybe.append((name, MIXED))
                    continue
            detail = ("not passed then" if a is None and name not in then.args else
                      "not passed now" if b is None and name not in now.args else "differs")
            out.append(Difference("parameter", name, detail))
        if maybe and not out:
            out.extend(Difference("parameter", name, detail) for name, detail in maybe)
    if now.version != then.version:
        old = versions.get(then.version or "") if then.parts is None else then.parts
        new = now.parts
        if old is None or new is None:
            out.append(Difference("code", "", "the code differs (the parts of the stored entry's version are not "
                                              "recorded: it was stored by an older casmon)"))
        else:
            parts = compare_parts(old, new)
            out.extend(parts or [Difference("code", "", "the version differs, in nothing its record names")])
    for k in sorted(set(now.files) | set(then.files)):
        a, b = then.files.get(k), now.files.get(k)
        if a != b:
            detail = "not read then" if a is None else "not read now" if b is None else file_changed(a, b)
            out.append(Difference("file", k[1], f"{detail} (parameter {k[0]!r})"))
    return out


def _entries(store: Store, fn: str) -> tuple[list[tuple[Digest, dict[str, Any]]], float]:
    """The function's live entries (one per key) and when it was last cleared."""
    cleared = max((r.get("time", 0.0) for r in store.lookup(KIND_CLEAR, name_digest(fn))), default=0.0)
    recs = []
    for k, r in store.records(KIND, strict=False):
        if r.get("fn") == fn:
            recs.append((k, r))
            if len(recs) >= ENTRIES_READ_MAX:
                break
    live = [(k, r) for k, r in newest_per_key(recs).values() if r.get("time", 0) > cleared]
    return live, cleared


def entry_alt(entry: dict[str, Any]) -> dict[str, str] | None:
    """A stored entry's parameter digests in the other form (:func:`same_value`): its content digests (``pc``);
    None where it records no lineage field (stored before lineage: nothing to compare with)."""
    pc = entry.get("pc")
    return pc if isinstance(pc, dict) else None if "rf" not in entry and "up" not in entry else {}


def _side_of(entry: dict[str, Any]) -> _Side:
    a = entry.get("a")
    return _Side(a if isinstance(a, dict) else None, _files_of(entry.get("files")),
                 entry.get("v") if isinstance(entry.get("v"), str) else None, None, entry_alt(entry))


def _nearest(now: _Side, live: list[tuple[Digest, dict[str, Any]]], versions: dict[str, dict[str, Any]],
             skip: bytes | None = None) -> list[Nearest]:
    scored = []
    for k, r in live:
        if skip is not None and bytes(k) == skip:
            continue
        diffs = _compare(now, _side_of(r), versions) or [
            Difference("key", "", "the key differs in something the entry does not record (the object of a bound "
                                  "method, a value hashed by type only, or the key format)")]
        scored.append((len(diffs), -float(r.get("time", 0.0)), k.hex(), r, diffs))
    scored.sort(key=lambda s: s[:3])
    return [Nearest(h, -t, d) for _n, t, h, _r, d in scored[:NEAREST]]


def main_hint(store: Store, fn: str) -> str:
    """A note when ``fn``'s entries are under the other name of the same function: ``__main__.f`` (a script run
    as ``python train.py``) and ``train.f`` (the same file imported) are keyed apart."""
    parts = fn.split(".")
    if parts[0] == "__main__":
        main = sys.modules.get("__main__")
        path = getattr(main, "__file__", None)
        if not path:
            return ""
        stem = os.path.splitext(os.path.basename(path))[0]
        candidates = [(f"{stem}.{'.'.join(parts[1:])}", stem)]
    else:
        candidates = [("__main__." + ".".join(parts[i:]), ".".join(parts[:i])) for i in range(1, len(parts))]
    for other, mod in candidates:
        # Its code-version records outlive a clear and gc: only live entries under the other name count.
        if store.lookup(KIND_FN, name_digest(other)) and _entries(store, other)[0]:
            return (f"note: {other} has entries. A script run as `python {mod.split('.')[-1]}.py` names its "
                    f"functions __main__.NAME, and the same file imported names them {mod}.NAME; the two are keyed "
                    f"apart. Call it the way it was cached, or cache it in a module both import.")
    return ""


def explain_call(state: CacheState, args: tuple, kwargs: dict) -> Explanation:
    """``f.explain(*args, **kwargs)``: see the module docstring."""
    key, _trackers, listing, spans = state.key_ctx(args, kwargs)
    store = state.store
    ex = Explanation(state.name, False)
    if key is None:
        ex.notes.append("this call cannot be keyed (see the warning): it is never cached")
        return ex
    if state.find(key) is not None:
        ex.hit = True
        return ex
    live, cleared = _entries(store, state.name)
    expired = 0
    if state.expires is not None:  # older entries are misses for this function now
        oldest = time.time() - state.expires
        stored = len(live)
        live = [(k, r) for k, r in live if r.get("time", 0) > oldest]
        expired = stored - len(live)
    own = max(store.lookup(KIND, key), key=lambda r: r.get("time", 0.0), default=None)
    if own is not None:
        t = own.get("time", 0.0)
        if t <= cleared:
            ex.notes.append(f"note: this call's entry (stored {time.strftime('%Y-%m-%d %H:%M', time.localtime(t))}) "
                            f"was cleared by `cache clear` at {time.strftime('%Y-%m-%d %H:%M', time.localtime(cleared))}")
        elif state.expires is not None and t <= time.time() - state.expires:
            ex.notes.append(f"note: this call's entry expired at "
                            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t + state.expires))} "
                            f"(expires_after={state.expires:g} s)")
    if expired and not live and not ex.notes:  # stored, but none is an entry now: "none is stored" would be untrue
        ex.notes.append(f"note: {expired:,} {'entry' if expired == 1 else 'entries'} of this function "
                        f"{'is' if expired == 1 else 'are'} past expires_after ({state.expires:g} s): misses now, "
                        "and gc drops them")
    ex.entries = len(live)
    version = state.version.hex() if state.version is not None else None
    digests = arg_digests(state, args, kwargs, spans)
    now = _Side(digests, _files_of(listing), version, state.current_parts(), legacy_digests(state, spans, digests))
    ex.nearest = _nearest(now, live, _versions(store, state.name))
    ex.elsewhere = main_hint(store, state.name)
    return ex


def explain_entry(store: Store, fn: str, key: Digest) -> Explanation:
    """What differs between the stored entry ``key`` of ``fn`` and its nearest other entries."""
    live, _cleared = _entries(store, fn)
    ex = Explanation(fn, True, entries=len(live))
    mine = [r for k, r in live if bytes(k) == bytes(key)]
    if not mine:
        ex.hit = False
        ex.notes.append(f"no live entry {key.hex()[:12]} of {fn}")
        return ex
    versions = _versions(store, fn)
    side = _side_of(mine[0])
    side.parts = versions.get(side.version or "")
    ex.nearest = _nearest(side, live, versions, skip=bytes(key))
    return ex


def code_versions(store: Store, fn: str) -> list[Version]:
    """The function's code versions, oldest first, each with what changed since the one before it."""
    seen: dict[str, Version] = {}
    for r in store.lookup(KIND_FN, name_digest(fn)):
        v = r.get("version")
        if not isinstance(v, str):
            continue
        t = float(r.get("time", 0.0)) if isinstance(r.get("time"), (int, float)) else 0.0
        parts = r.get("parts") if isinstance(r.get("parts"), dict) else None
        old = seen.get(v)
        if old is None or (old.parts is None and parts is not None):
            seen[v] = Version(v, min(t, old.time) if old else t, parts)
        else:
            old.time = min(old.time, t)
    out = sorted(seen.values(), key=lambda x: x.time)
    for prev, cur in zip(out, out[1:]):
        if prev.parts is not None and cur.parts is not None:
            cur.changes = compare_parts(prev.parts, cur.parts)
        else:
            cur.changes = [Difference("code", "", "changed (an older casmon did not record the parts)")]
    return out


# -- the code-change warning (casmon.caching.versions) ------------------------------------------------------
def _what_changed(latest: dict[str, Any], parts: dict[str, Any]) -> str:
    old = latest.get("parts")
    if not isinstance(old, dict):
        return ""
    diffs = compare_parts(old, parts)
    if not diffs:
        return ""
    names = [d.clause() for d in diffs[:4]]
    more = f" and {len(diffs) - 4} more" if len(diffs) > 4 else ""
    tail = " (`f.explain(...)` shows the source diff)" if any(d.diff for d in diffs) else ""
    return f" Since the version cached last: {', '.join(names)}{more}{tail}."


def code_change_message(state: CacheState, version: Digest, seen: list[dict[str, Any]], latest: dict[str, Any],
                        parts: dict[str, Any]) -> str:
    """What happens now that the code is ``version``: which entries are used, how many other versions hold."""
    from casmon.view.text import plural  # a change of code loads it
    vh = version.hex()
    name = state.name
    first = min((r.get("time", 0) for r in seen if r.get("version") == vh), default=None)
    mine, others, other_versions, unknown = _entries_by_version(state, vh)
    if others is None:
        rest = "entries of other versions stay in the store, unused while the code is as it is now"
    elif others == 0:
        rest = "no entries of other versions remain"
    else:
        rest = (f"{plural(others, 'entry', 'entries')} of {plural(other_versions or 0, 'other version')} "
                f"{'stays' if others == 1 else 'stay'} in the store, unused while the code is as it is now")
    if unknown:
        rest += (f" ({plural(unknown, 'older entry', 'older entries')} {'does' if unknown == 1 else 'do'} not say "
                 "its version)")
    free = (f"`casmon cache clear {name}`, then two `casmon gc` an hour apart (or `casmon gc --now` while "
            "nothing else writes), frees the space of all of them.")
    changed = _what_changed(latest, parts)
    if first is not None:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(first))
        used = ("its entries are used" if not mine and (mine is None or unknown) else
                "none of its entries remain, so calls compute again" if not mine else
                f"its {plural(mine, 'entry', 'entries')} {'is' if mine == 1 else 'are'} used")
        return (f"casmon: the code of {name} matches a version cached before (first seen {when}), not the "
                f"one cached last: {used}; {rest}. {free}{changed}")
    return (f"casmon: the code of {name} (or of a function it calls, or a value it reads) changed since its "
            f"results were cached: this version has none yet, so calls compute again; {rest} (used again "
            f"if the code goes back). {free}{changed}")


def _entries_by_version(state: CacheState, vh: str) -> tuple[int | None, int | None, int | None, int]:
    """``(entries of version vh, entries of other versions, how many other versions, entries that do not
    say their version)``, one per key (entries written before casmon recorded versions say none);
    ``(None, None, None, 0)`` when the cache table is too large to read for a warning."""
    store = state.store
    from casmon.caching.versions import VERSION_COUNT_MAX

    if store.table(KIND).count() > VERSION_COUNT_MAX:
        return None, None, None, 0
    cleared = state.cleared_time(refresh=True)
    live = newest_per_key((k, r) for k, r in store.records(KIND, strict=False)
                          if r.get("fn") == state.name and r.get("time", 0) > cleared)
    mine, versions, others, unknown = 0, set(), 0, 0
    for _k, r in live.values():
        v = r.get("v")
        if v == vh:
            mine += 1
        elif v is None:
            unknown += 1
        else:
            others += 1
            versions.add(v)
    return mine, others, len(versions), unknown
