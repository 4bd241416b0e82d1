"""Writing a run into a folder: ``restore`` (its code: commit, patch, tracked files) and ``export``
(the plain folder FineCache users know).

Every path a run names is checked before anything is written: nothing outside
the target folder, through a symlink, or into version-control metadata (which
can run commands), as casmon and as ``git apply`` read it.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from casmon.errors import CasmonError
from casmon.runs.listing import RunInfo, load_run, readable_run
from casmon.runs.metrics import json_safe
from casmon.store.store import Store

__all__ = ["restore", "export", "safe_target", "unsafe_path", "vcs_component", "UnsafePathError", "VCS_DIRS"]

#: Folders of version control systems: restore and export never write into one (any case, any depth).
VCS_DIRS = frozenset({".git", ".hg", ".svn", ".bzr", "_darcs", "cvs", ".jj", ".pijul", ".fslckout", "_fossil_", ".fossil"})
# characters macOS (HFS+) and Windows ignore in names, so ".g\u200cit" or ".git." would still be ".git"
_IGNORABLE = re.compile("[\u200b-\u200f\u202a-\u202e\u2060-\u2064\u206a-\u206f\ufeff]")


class UnsafePathError(CasmonError, ValueError):
    """A run names a path that restore or export must not write (outside the folder, or VCS metadata)."""


def vcs_component(rel: str) -> str | None:
    """The version-control folder (``.git``, ``.hg``, ``.svn``, ...) a path goes through, in any case, or None.

    Names are compared as macOS and Windows would: case-folded, ignorable
    Unicode characters removed, trailing dots and spaces dropped, ``git~1``
    taken for ``.git``; both ``/`` and ``\\`` separate components.
    """
    for part in re.split(r"[/\\]", rel):
        norm = _IGNORABLE.sub("", part).rstrip(" .").casefold()
        base = norm.split(":", 1)[0].rstrip(" .")  # NTFS alternate data streams: ".git::$INDEX_ALLOCATION"
        if norm in VCS_DIRS or base in VCS_DIRS or norm.startswith("git~"):
            return part
    return None


def unsafe_path(rel: object) -> str | None:
    """Why relative path ``rel`` (from a run: a tracked file, a folder artifact's file) must not be written under
    a folder, or None: no file name, absolute, ``..``, a part that names the folder itself, VCS metadata. Long
    paths and odd characters are no reason: a saved folder holds what the file system held."""
    if not isinstance(rel, str) or not rel or "\0" in rel:
        return "not a file name"
    vcs = vcs_component(rel)
    if vcs is not None:
        return (f"it is inside version-control metadata ({vcs}/), which can run commands (hooks, config); casmon "
                "never restores or exports it")
    if Path(rel).is_absolute() or rel.startswith(("/", "\\")) or any(part == ".." for part in re.split(r"[/\\]", rel)) \
            or re.match(r"^[A-Za-z]:", rel):
        return "it would escape the target folder"
    if any(part in ("", ".") for part in re.split(r"[/\\]", rel)):  # "sub/." or "a//b": not the name of a file
        return "it has an empty or '.' part"
    return None


def safe_target(root: Path, rel: str) -> Path:
    """``root / rel``, refusing what :func:`unsafe_path` refuses and paths through symlinks."""
    why = unsafe_path(rel)
    if why is not None:
        raise UnsafePathError(f"refusing to write {str(rel)[:200]!r}: {why}")
    p = Path(rel)
    target = root / p
    cur = root
    for part in p.parts[:-1]:
        cur = cur / part
        if cur.is_symlink():
            raise UnsafePathError(f"refusing to write {rel!r}: {cur} is a symlink")
    if target.is_symlink():
        raise UnsafePathError(f"refusing to write {rel!r}: it is a symlink")
    resolved = target.resolve()
    if resolved != root.resolve() and root.resolve() not in resolved.parents:
        raise UnsafePathError(f"refusing to write {rel!r}: it would escape the target folder")
    return target


def _prepare_dir(target: str | os.PathLike) -> Path:
    root = Path(target)
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty; restore and export write into a new or empty folder")
    root.mkdir(parents=True, exist_ok=True)
    return root.resolve()


def restore(run: RunInfo | str, target: str | os.PathLike, store: Store | str | None = None, repo: str | None = None,
            artifacts: bool = False) -> Path:
    """Write the run's code into ``target``: the commit's tree, the patch applied, the tracked files.

    The commit is read from the repository the run was recorded in (or ``repo``). ``artifacts``: also write the
    run's artifacts as ``export`` does (``artifacts/``, ``artifacts.json``), unless the code has those names.
    """
    r = readable_run(run if isinstance(run, RunInfo) else load_run(run, store))
    for rel in r.manifest.get("files", {}):  # refuse before anything is written
        safe_target(Path(target).resolve(), rel)
    patch = r.patch()
    if patch:
        _check_patch_paths(Path(target).resolve(), patch, r.name)
    root = _prepare_dir(target)
    g = r.manifest.get("git", {})
    if g.get("commit"):
        import git

        repo_path = repo or g.get("root")
        try:
            gr = git.Repo(repo_path, search_parent_directories=True)
            gr.commit(g["commit"])
        except Exception as e:  # noqa: BLE001
            raise CasmonError(f"run {r.name}: commit {g['commit'][:12]} is not in repository {repo_path} ({e}); "
                              "pass repo= the repository that has it") from None
        with tempfile.TemporaryFile() as tf:
            gr.archive(tf, treeish=g["commit"], format="tar")
            tf.seek(0)
            with tarfile.open(fileobj=tf) as tar:
                members = []
                for m in tar.getmembers():
                    safe_target(root, m.name)  # raises on anything escaping
                    members.append(m)
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(root, members=members, filter="data")
                else:  # pragma: no cover - Python < 3.11.4
                    tar.extractall(root, members=members)
    if patch:
        _apply_patch(root, patch, r.name)
    for rel, meta in r.manifest.get("files", {}).items():
        dest = safe_target(root, rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        data = r.file(rel)
        dest.write_bytes(data)
        os.chmod(dest, meta.get("mode", 0o644) & 0o777)
    if artifacts:
        taken = [n for n in ("artifacts", "artifacts.json") if os.path.lexists(root / n)]
        if taken:
            raise FileExistsError(f"run {r.name}: its code was restored into {root}, but it has {taken[0]!r} of its "
                                  f"own, so its artifacts were not written; `casmon export` writes them apart")
        _export_artifacts(r, root)
    return root


_PATCH_PATH_LINES = ("+++ ", "--- ", "diff --git ", "rename from ", "rename to ", "copy from ", "copy to ",
                     "rename old ", "rename new ")


def _unquote(tok: str) -> str:
    """A path as git quotes it (``"a/\\056git/config"``: C escapes, octal bytes) in plain text."""
    if len(tok) >= 2 and tok[0] == tok[-1] == '"':
        body = tok[1:-1]
        try:
            return body.encode("latin-1", "backslashreplace").decode("unicode_escape").encode("latin-1").decode("utf-8", "replace")
        except (UnicodeDecodeError, UnicodeEncodeError):
            return body
    return tok


def _patch_paths(patch: bytes) -> list[str]:
    """Every path a patch names in its headers, unquoted (a first look; git's own list is checked too)."""
    out = []
    for line in patch.decode("utf-8", "replace").splitlines():
        if not line.startswith(_PATCH_PATH_LINES):
            continue
        rest = line.split(" ", 2)[2] if line.startswith(("diff --git ", "rename ", "copy ")) else line[4:]
        toks = re.findall(r'"(?:[^"\\]|\\.)*"|\S+', rest)
        for tok in toks:
            tok = _unquote(tok)
            if tok == "/dev/null" or tok.startswith("--"):
                continue
            out.append(tok[2:] if tok[:2] in ("a/", "b/") and line.startswith(("+++", "---", "diff")) else tok)
    return out


def _git_apply_env(root: Path) -> dict:
    # no repository above the target is discovered, no user or system config is read (no hooks, no filters)
    return dict(os.environ, GIT_CEILING_DIRECTORIES=str(root.parent), GIT_CONFIG_NOSYSTEM="1",
                GIT_CONFIG_GLOBAL=os.devnull, HOME=str(root.parent))


def _check_patch_paths(root: Path, patch: bytes, name: str) -> None:
    """Refuse a patch that touches a path outside ``root`` or inside VCS metadata, as we and git read it."""
    paths = _patch_paths(patch)
    with tempfile.TemporaryDirectory(prefix="casmon-patch-") as tmp:
        pf = os.path.join(tmp, "run.patch")
        with open(pf, "wb") as f:
            f.write(patch)
        p = subprocess.run(["git", "apply", "--numstat", "--summary", "-z", pf], cwd=tmp, env=_git_apply_env(Path(tmp)),
                           capture_output=True)
        if p.returncode == 0:
            for raw in p.stdout.split(b"\0"):
                field = raw.decode("utf-8", "surrogateescape")
                if "\t" in field:  # "added\tdeleted\tpath" (a rename's two paths follow as fields of their own)
                    field = field.split("\t", 2)[2]
                if field and not field.startswith((" create mode", " delete mode", " mode change", " rename", " copy")):
                    paths.append(field)
    for rel in paths:
        try:
            safe_target(root, rel)
        except UnsafePathError as e:
            raise UnsafePathError(f"run {name}: the patch is refused: {e}") from None


def _apply_patch(root: Path, patch: bytes, name: str) -> None:
    _check_patch_paths(root, patch, name)
    with tempfile.NamedTemporaryFile(suffix=".patch", delete=False) as f:
        f.write(patch)
        pf = f.name
    try:
        p = subprocess.run(["git", "apply", "--binary", "--whitespace=nowarn", pf], cwd=root, env=_git_apply_env(root),
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise CasmonError(f"run {name}: the patch does not apply: {p.stderr.strip()}")
    finally:
        os.unlink(pf)


def export(run: RunInfo | str, target: str | os.PathLike, store: Store | str | None = None,
           progress: Callable[[str, int, int], None] | None = None) -> Path:
    """Write the plain folder FineCache users know: information.json, current_changes.patch, console.log, tracked files,
    ``metrics.csv`` (metric, step, value, time) when the run logged metrics, and its artifacts: files and folders
    under ``artifacts/``, each listed in ``artifacts.json`` (values that are no file, with how to load them).

    ``progress(phase, done, total)`` is told of each tracked file written (``casmon export`` draws a bar).
    """
    r = readable_run(run if isinstance(run, RunInfo) else load_run(run, store))
    for rel in r.manifest.get("files", {}):  # refuse before anything is written
        safe_target(Path(target).resolve(), rel)
    root = _prepare_dir(target)
    (root / "information.json").write_text(json.dumps(json_safe(r.information()), indent=2, ensure_ascii=False,
                                                      allow_nan=False), encoding="utf-8")
    (root / "current_changes.patch").write_bytes(r.patch())
    output = r.output()  # a live or lost run's output is what was written so far
    if r.manifest.get("output") is not None or output:
        (root / "console.log").write_text(output, encoding="utf-8", errors="surrogateescape")
    series = r.metrics() if r.metric_summary() or r.manifest.get("status") == "running" else {}
    if series:
        with open(root / "metrics.csv", "w", encoding="utf-8", newline="") as f:
            w = csv.writer(f)
            w.writerow(["metric", "step", "value", "time"])
            for name, s in series.items():
                w.writerows(zip([name] * len(s), s.steps.tolist(), map(repr, s.values.tolist()), s.times.tolist()))
    files = list(r.manifest.get("files", {}))
    for i, rel in enumerate(files):
        if progress is not None:
            progress("export files", i, len(files))
        dest = safe_target(root, rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(r.file(rel))
    if progress is not None:
        progress("export files", len(files), len(files))
    _export_artifacts(r, root)
    return root


def _export_artifacts(r: RunInfo, root: Path) -> None:
    """The run's file and folder artifacts under ``artifacts/``, and ``artifacts.json`` listing every artifact:
    where it was written, or why not, or how to load a value or checkpoint (no file format holds any value)."""
    from casmon.runs import artifacts

    arts = artifacts.read_artifacts(r.store, r.ref)
    if not arts:
        return
    base = root / "artifacts"
    index = []
    for name, a in arts.items():
        entry: dict = {"name": name, "kind": a.kind, "size": a.size, "digest": a.digest}
        if a.step is not None:
            entry["step"] = a.step
        if a.kind in ("file", "folder"):
            try:
                artifacts.write_artifact(r.store, a, r.name, safe_target(base, name))
                entry["path"] = f"artifacts/{name}"
            except CasmonError as e:  # a damaged value, a name that cannot be written: the rest still is
                entry["not_written"] = str(e).splitlines()[0]
        else:
            entry["load"] = f"casmon.load_run({r.name!r}).load({name!r})"
        index.append(entry)
    (root / "artifacts.json").write_text(json.dumps(index, indent=2, ensure_ascii=False), encoding="utf-8")

