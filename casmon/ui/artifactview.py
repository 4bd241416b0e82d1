"""What runs keep, in the UI: the run page's artifacts, checkpoints and resumes, the compare page's artifact
differences, and ``/artifact`` downloads.

A run page lists each artifact (name, kind, size, stored size, the share another run, cache entry or ref
also holds) with a download for files and folders; checkpoints are listed with their steps. A download
streams the file back a piece at a time (a large file's content-defined pieces, each checked as read);
a folder comes back as a zip written as it streams (stored, not deflated: most artifacts are compressed
or numeric already). The compare page says, per artifact name, whether the runs hold the same digest,
a different one, or none.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from typing import Any, cast
from urllib.parse import quote

from casmon.errors import CasmonError
from casmon.ui.pages import Ctx, heading, run_url, scroll, url
from casmon.view import display
from casmon.view.display import Html, code, esc, table, when
from casmon.view.text import plural, size

__all__ = ["Download", "resume_facts", "run_section", "compare_section", "download"]


class Download:
    """A response streamed to the client: ``chunks`` of bytes, ``length`` if known, the file's name."""

    def __init__(self, chunks: Iterator[bytes], filename: str, ctype: str, length: int | None) -> None:
        self.chunks, self.filename, self.ctype, self.length = chunks, filename, ctype, length

    def disposition(self) -> str:
        ascii_name = "".join(c if c.isascii() and c.isprintable() and c not in '"\\;' else "_" for c in self.filename)
        return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(self.filename, safe='')}"


def resume_facts(r: Any) -> list[tuple[str, Any]]:
    """The run page's line saying the run was resumed: how often, when last, after what."""
    resumes = r.resumes
    if not resumes:
        return []
    last = resumes[-1]
    return [("resumed", f"{plural(len(resumes), 'time')}, last at {when(last['time'])} on {last['host']} "
                        f"(after it was {last['status']})")]


def _arts(r: Any, shared: bool) -> tuple[list[dict[str, Any]], str | None]:
    try:
        return r.artifacts(shared=shared), None
    except CasmonError as e:
        return [], str(e).splitlines()[0] if str(e) else type(e).__name__


def run_section(ctx: Ctx, tail: str, r: Any, shared: bool = False) -> list[Any]:
    """The run page's artifacts, checkpoints and resumes; nothing when the run has none of them. ``shared``:
    count the share other runs hold (a walk of the whole store: seconds on a large one, so a link asks)."""
    out: list[Any] = []
    arts, why = _arts(r, shared)
    if why:
        out += [heading("Artifacts", 2, "artifacts"), display.error_line(f"artifacts: {why}")]
    named = [a for a in arts if a["kind"] != "checkpoint"]
    ckpts = [a for a in arts if a["kind"] == "checkpoint"]
    if named:
        rows: list[tuple[Any, ...]] = []
        for a in named:
            dl: Any = ""
            if a["kind"] in ("file", "folder"):
                dl = ctx.link(url("/artifact", run=tail, name=a["name"]), "zip" if a["kind"] == "folder" else "download",
                              "artifact-download")
            kind = a["kind"] + (f" ({plural(a['files'], 'file')})" if a.get("files") is not None else "")
            rows.append((code(a["name"]), kind, size(a["size"]), size(a["stored"]), _share(a, shared), dl))
        total = sum(a["stored"] for a in named)
        out += [heading(f"Artifacts ({len(named)}, {size(total)} stored)", 2, "artifacts"),
                scroll(table(["name", "kind", "size", "stored", "shared", ""], rows, num=[2, 3, 4]))]
    if ckpts:
        ckpts.sort(key=lambda a: a["step"] if type(a["step"]) is int else -1)
        rows = [(a["step"], size(a["size"]), size(a["stored"]), _share(a, shared), when(a["time"])) for a in ckpts]
        out += [heading(f"Checkpoints ({len(ckpts)})", 2, "checkpoints"),
                scroll(table(["step", "size", "stored", "shared", "saved"], rows, num=[0, 1, 2, 3]))]
    if named or ckpts:
        ask = "" if shared else f" -- {ctx.link(run_url(tail) + '?shared=1#artifacts', 'count it', 'count-shared')} (reads the whole store)"
        out.append(Html('<p class="muted">stored: what the store holds for it, compressed; shared: the part another run, '
                        f"cache entry or ref holds too (deleting this run would not free it){ask}</p>"))
    resumes = r.resumes
    if resumes:
        rows = [(when(x["time"]), x["host"], x["pid"], x["status"]) for x in resumes]
        out += [heading(f"Resumed {plural(len(resumes), 'time')}", 2, "resumes"),
                scroll(table(["when", "host", "pid", "status before"], rows))]
    return out


def _share(a: dict[str, Any], counted: bool) -> str:
    if a.get("shared") is None:
        return "?" if counted else ""
    return f"{size(a['shared'])} ({a['shared'] / a['stored']:.0%})" if a["stored"] else "0"


def compare_section(cmp: Any) -> list[Any]:
    """The compare page's artifacts: per name, each run's digest, and whether they differ (only in some runs,
    or the same name with another digest)."""
    from casmon.runs.artifacts import read_artifacts

    per_run: list[dict[str, Any]] = []
    for r in cmp.runs:
        try:
            per_run.append(read_artifacts(r.store, r.ref))
        except CasmonError:
            per_run.append({})
    names = sorted(set().union(*per_run)) if per_run else []
    if not names:
        return []
    rows, differ = [], []
    for n in names:
        got = [p.get(n) for p in per_run]
        digests = {a.digest if a is not None else None for a in got}
        d = len(digests) > 1
        if d:
            differ.append(n)
        cells = "".join(f"<td>{code(display.hexshort(a.digest)) + ' ' + esc(size(a.size)) if a else '<span class=muted>none</span>'}</td>"
                        for a in got)
        rows.append(f'<tr class="{"differs" if d else "same"}" data-key="{esc(n)}"><th>{esc(n)}</th>{cells}</tr>')
    heads = "".join(f"<th>{esc(r.name)}</th>" for r in cmp.runs)
    summary = (f"{plural(len(differ), 'artifact')} of {len(names)} differ" + (": " + ", ".join(differ[:10]) if differ else "")
               + (", ..." if len(differ) > 10 else ""))
    return [heading("Artifacts", 2, "artifacts"), Html(f'<p class="summary" id="artifacts-summary">{esc(summary)}</p>'),
            scroll(Html(f'<table class="artifacts"><thead><tr><th>name</th>{heads}</tr></thead>'
                        f'<tbody>{"".join(rows)}</tbody></table>'))]


def download(store: Any, r: Any, name: str) -> Download:
    """Artifact ``name`` of run ``r`` as a download: a file's bytes, or a folder as a zip."""
    from casmon.runs import artifacts, pieces

    found = artifacts.read_artifacts(store, r.ref)
    a = found.get(name)
    if a is None:
        raise LookupError(f"run {r.name} has no artifact {name!r}")
    leaf = name.rsplit("/", 1)[-1]
    what = f"run {r.name}: artifact {name}"
    if a.kind == "file":
        chunks = pieces.chunks(store, a.digest, what, a.size)
        first = next(chunks, b"")  # a damage found before anything is sent is an error page, not a cut file
        return Download(_chain(first, chunks), leaf, "application/octet-stream", a.size)
    if a.kind == "folder":
        files = artifacts.load(store, r.ref, r.name, name)
        return Download(_zip(store, files, what), leaf + ".zip", "application/zip", None)
    raise LookupError(f"artifact {name!r} of run {r.name} is a {a.kind}, not a file: load it with "
                      f"casmon.load_run({r.name!r}).load({name!r})")


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


class _Sink:
    """A write-only stream zipfile writes into; what it wrote is taken out a piece at a time."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.pos = 0

    def write(self, b: Any) -> int:
        self.parts.append(bytes(b))
        self.pos += len(b)
        return len(b)

    def tell(self) -> int:
        return self.pos

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        out = b"".join(self.parts)
        self.parts.clear()
        return out


def _zip(store: Any, files: dict[str, dict[str, Any]], what: str) -> Iterator[bytes]:
    from casmon.runs import pieces
    from casmon.runs.folders import unsafe_path

    sink = _Sink()
    with zipfile.ZipFile(cast(Any, sink), "w", zipfile.ZIP_STORED, allowZip64=True) as z:  # written, never read
        for rel, f in sorted(files.items()):
            if unsafe_path(rel) is not None:  # a crafted listing's '../x', '/etc/x' or '.git/hooks/x'
                continue
            # a name the file system held as bytes that are not UTF-8 (kept as surrogates): a zip holds UTF-8 only
            info = zipfile.ZipInfo(rel.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))
            info.external_attr = ((f.get("mode") or 0o644) & 0o777 | 0o100000) << 16
            with z.open(info, "w", force_zip64=f["size"] >= zipfile.ZIP64_LIMIT) as w:  # zipfile's own bound
                for b in pieces.chunks(store, f["digest"], f"{what}/{rel}", f["size"]):
                    w.write(b)
                    yield sink.take()
    yield sink.take()
