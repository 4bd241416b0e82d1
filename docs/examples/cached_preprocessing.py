"""Cached preprocessing with casmon: run it twice and the second run skips the work.

    python docs/examples/cached_preprocessing.py [STORE]

The first run computes features for three "recordings" (a few seconds); the
second run loads them from the store in milliseconds. Edit `normalise` below
(say, change 1e-9 to 1e-6) and run again: only what depends on it is
recomputed, and casmon warns once that the code changed.
"""

import sys
import time

import numpy as np

import casmon

STORE = sys.argv[1] if len(sys.argv) > 1 else ".casmon"


def normalise(x):
    return (x - x.mean(axis=0)) / (x.std(axis=0) + 1e-9)


@casmon.cache(store=STORE, ignore=["verbose"])
def features(recording: np.ndarray, window: int = 256, verbose: bool = False) -> np.ndarray:
    """Spectral power per window: the slow step we do not want to repeat."""
    if verbose:
        print(f"  computing features for {recording.shape}")
    n = recording.shape[0] // window
    frames = recording[: n * window].reshape(n, window, -1)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    time.sleep(0.5)  # stands in for heavier work
    return normalise(power.mean(axis=2))


def main() -> None:
    rng = np.random.default_rng(0)
    recordings = [rng.standard_normal((200_000, 8)) for _ in range(3)]
    t = time.perf_counter()
    feats = [features(r, verbose=True) for r in recordings]
    print(f"3 recordings -> features {feats[0].shape} in {time.perf_counter() - t:.2f} s")
    print(f"cache: {features.cache_info()}")
    ref = features.ref(recordings[0])
    print(f"first result stored as {ref.digest.short}, {ref.nbytes / 2**20:.1f} MiB; lazily: {ref.open_array()}")


if __name__ == "__main__":
    main()
