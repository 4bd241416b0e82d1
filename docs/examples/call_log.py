"""Log the calls of a function deep in a pipeline, then get call N's exact inputs back.

    python docs/examples/call_log.py [STORE]

Run it, then look around:  casmon calls --store STORE
                           casmon show normalise 2 --store STORE
"""

import sys

import numpy as np

import casmon

STORE = sys.argv[1] if len(sys.argv) > 1 else ".casmon"


@casmon.intercept(store=STORE)
def normalise(batch: np.ndarray, eps: float = 1e-6, clip: float | None = None) -> np.ndarray:
    out = (batch - batch.mean()) / (batch.std() + eps)
    return np.clip(out, -clip, clip) if clip else out


def pipeline() -> None:
    rng = np.random.default_rng(7)
    for i in range(5):
        batch = rng.standard_normal((256, 32)) * (i + 1)
        normalise(batch, clip=3.0 if i % 2 else None)


if __name__ == "__main__":
    pipeline()
    casmon.flush()  # records are also flushed every few seconds and at exit

    log = casmon.load(STORE)
    print(log)
    args = log.get_args("normalise", 2)  # the latest session by default
    print("call 2:", args)
    batch, kwargs = log.get("normalise", 2)
    print("its input again:", batch[0].shape, kwargs)
    replay = log.replay("normalise", 2)  # a regression check: same inputs, same result?
    print(replay)
