"""A live run for the dashboard's test, in a process of its own: ``python -m tests.ui.dashboard_writer STORE DIR``.

Logs ``train/loss`` every 20 ms; once ``DIR/val`` exists, ``val/loss`` too (a metric, and a group, the page has
not seen); ends when ``DIR/stop`` exists (at most a minute). The test creates those files when it has seen
what it waits for, so nothing races a fixed time.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import casmon


def main(store: str, folder: str) -> None:
    d = Path(folder)
    with casmon.record(comment="live", store=store, params={"lr": 0.1}) as run:
        t0, i = time.time(), 0
        while time.time() - t0 < 60 and not (d / "stop").exists():
            points = {"train/loss": 1.0 / (i + 1)}
            if (d / "val").exists():
                points["val/loss"] = 2.0 / (i + 1)
            run.log(**points)
            i += 1
            time.sleep(0.02)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
