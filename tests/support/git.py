"""Real git repositories for the tests of runs and their views: a fixed author, no user configuration."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

#: Who commits in a test repository (no global git configuration is needed or read for it).
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid"}


def git(repo: Path, *args: str) -> str:
    """Run ``git -C repo ARGS`` and return its output, stripped; fails the test if git fails."""
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=dict(os.environ, **GIT_ENV)).stdout.strip()
