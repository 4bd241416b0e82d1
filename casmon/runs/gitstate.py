"""The code state of a run: commit, branch, dirty flag and a patch of every uncommitted change.

Captured through GitPython. The patch is ``git diff --binary`` of the work
tree against HEAD **including untracked, not-ignored files** (and binary files,
in a form ``git apply`` takes back). It is made with a temporary copy of the
index, so the user's own index (what they staged) is never touched.

Nothing here raises into the user's program: a folder outside git, a detached
HEAD, a repository without commits, a git that fails -- each gives what can be
had and a note saying what is missing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CodeState", "capture_code_state"]

#: Untracked files larger than this are left out of the patch, with a warning.
UNTRACKED_MAX = 10 << 20


@dataclass
class CodeState:
    root: str | None = None  # repository root (or the working folder outside git)
    git: bool = False  # inside a git work tree
    commit: str | None = None
    branch: str | None = None  # None when HEAD is detached
    dirty: bool = False
    patch: bytes = b""
    untracked: list[str] = field(default_factory=list)  # untracked files in the patch
    skipped: list[str] = field(default_factory=list)  # untracked files left out (too large)
    notes: list[str] = field(default_factory=list)  # what could not be captured, and why


def capture_code_state(path: str | os.PathLike | None = None, exclude: list[str] | None = None,
                       untracked_max: int = UNTRACKED_MAX) -> CodeState:
    """The code state of the repository around ``path`` (default: the working folder).

    ``exclude``: folders (absolute or relative to the root) never put in the
    patch, such as the store itself.
    """
    start = Path(path or os.getcwd()).resolve()
    state = CodeState()
    try:
        import git
    except ImportError as e:  # pragma: no cover - GitPython is a dependency
        state.root = str(start)
        state.notes.append(f"GitPython unavailable: {e}")
        return state
    try:
        repo = git.Repo(start, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        state.root = str(start)
        state.notes.append("not a git repository: no commit or patch recorded")
        return state
    except Exception as e:  # noqa: BLE001 - e.g. git not installed
        state.root = str(start)
        state.notes.append(f"not a git repository: git failed ({e})")
        return state
    try:
        work_tree = repo.working_tree_dir
        if work_tree is None:
            raise TypeError("a bare repository")
        root = Path(work_tree).resolve()
    except Exception:  # noqa: BLE001 - a bare repository
        state.root = str(start)
        state.notes.append("not a git repository: a bare repository has no work tree")
        return state
    state.root = str(root)
    state.git = True
    try:
        state.commit = repo.head.commit.hexsha
    except ValueError:
        state.notes.append("the repository has no commits yet: the patch holds every file")
    except Exception as e:  # noqa: BLE001
        state.notes.append(f"cannot read HEAD: {e}")
    try:
        state.branch = None if repo.head.is_detached else repo.active_branch.name
        if repo.head.is_detached:
            state.notes.append("detached HEAD")
    except Exception:  # noqa: BLE001 - unborn branch
        try:
            state.branch = repo.active_branch.name
        except Exception:  # noqa: BLE001
            state.branch = None
    try:
        _patch(repo, root, state, exclude or [], untracked_max)
    except Exception as e:  # noqa: BLE001 - never crash the user's program over the patch
        state.notes.append(f"could not make the patch of uncommitted changes: {e}")
    return state


def _is_marker(path: Path) -> bool:
    """Whether ``path`` is a casmon store's ``casmon.json`` (and not a file of the user's that has its name)."""
    from casmon.store.marker import parse_marker

    try:
        with open(path, "rb") as f:
            data = f.read(1 << 16)
    except OSError:
        return False
    info, wrong = parse_marker(data)
    return wrong is None and "casmon" in info


def _patch(repo, root: Path, state: CodeState, exclude: list[str], untracked_max: int) -> None:
    excluded = []
    for ex in exclude:
        p = Path(ex)
        p = p if p.is_absolute() else root / p
        try:
            rel = p.resolve().relative_to(root)
        except ValueError:
            continue  # outside the repository: never part of it
        if str(rel) not in ("", "."):
            excluded.append(rel.as_posix())
    untracked = [u for u in repo.git.ls_files("--others", "--exclude-standard", "-z").split("\0") if u]
    # any casmon store in the work tree (joblib's Memory keeps one in its folder) is data, not code
    excluded += [u[:-len("/casmon.json")] for u in untracked if u.endswith("/casmon.json") and _is_marker(root / u)]
    untracked = [u for u in untracked if not any(u == e or u.startswith(e + "/") for e in excluded)]
    keep = []
    for u in untracked:
        try:
            size = (root / u).stat().st_size
        except OSError:
            continue
        if size > untracked_max:
            state.skipped.append(u)
        else:
            keep.append(u)
    state.untracked = keep
    empty_tree = repo.git.hash_object("-t", "tree", os.devnull)
    base = state.commit or empty_tree
    tmpdir = tempfile.mkdtemp(prefix="casmon-index-")
    try:
        index = os.path.join(tmpdir, "index")
        real_index = Path(repo.git_dir) / "index"
        if real_index.exists():
            shutil.copyfile(real_index, index)
        with repo.git.custom_environment(GIT_INDEX_FILE=index):
            if state.commit:
                repo.git.read_tree(state.commit)  # start from HEAD, not from what the user staged
            repo.git.add("-u", "--", ".")  # every change to tracked files
            for i in range(0, len(keep), 200):
                repo.git.add("-f", "--", *keep[i : i + 200])
            patch = repo.git.diff("--cached", "--binary", "--no-color", "--no-ext-diff", "--no-renames", base,
                                  stdout_as_string=False, strip_newline_in_stdout=False)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    state.patch = bytes(patch)
    state.dirty = bool(state.patch)
