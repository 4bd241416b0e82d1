"""A run that goes on for a few seconds in a process of its own (the UI's live tests watch it from another).

``python -m tests.ui.live_writer STORE SECONDS|STOPFILE [fail]``: logs ``loss`` and ``acc`` every 20 ms and prints a
line every 50 steps, as a training loop would; set ``CASMON_HEARTBEAT_S=1`` so its ref says it is alive each second.
It runs for SECONDS, or until the file STOPFILE appears (at most a minute): then a test ends it once it has seen
what it watches for, neither waiting out a fixed time nor racing one. At the end it sets ``run.info["final"]``;
with ``fail`` it then raises (the run fails, with a traceback).
"""

from __future__ import annotations

import os
import sys
import time

import casmon


def main(store: str, until: str, fail: bool = False) -> None:
    try:
        seconds, stop = float(until), None
    except ValueError:
        seconds, stop = 60.0, until
    with casmon.record(comment="live", store=store, capture_output=True, params={"lr": 0.1, "cfg": {"depth": 4}}) as run:
        t0, i = time.time(), 0
        while time.time() - t0 < seconds and not (stop is not None and os.path.exists(stop)):
            run.log(loss=1.0 / (i + 1), acc=min(1.0, i / 200))
            i += 1
            if i % 50 == 0:
                print(f"step {i}", flush=True)
            time.sleep(0.02)
        run.info["final"] = 0.9
        if fail:
            raise RuntimeError(f"diverged at step {i}")


if __name__ == "__main__":
    try:
        main(sys.argv[1], sys.argv[2], sys.argv[3:] == ["fail"])
    except RuntimeError:
        sys.exit(3)
