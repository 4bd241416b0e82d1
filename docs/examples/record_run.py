"""Record an experiment run: code state, config files, output and results, comparable and restorable.

    cd your-git-project && python /path/to/record_run.py [STORE]

Then:  casmon runs            # number, comment, time, status, commit, dirty
       casmon show latest     # what the run was
       casmon diff 1 2        # what changed between two runs
       casmon restore 1 /tmp/run1-code   # the exact code the run saw
"""

import sys

import numpy as np

import casmon

STORE = sys.argv[1] if len(sys.argv) > 1 else ".casmon"


@casmon.cache(store=STORE)
def load_data(n: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((n, 16))


def main() -> None:
    with casmon.record(comment="baseline", track=[r"\.(yaml|json|toml)$"], store=STORE) as run:
        data = load_data(10_000)
        for epoch in range(3):
            loss = float(np.mean(data**2)) / (epoch + 1)
            print(f"epoch {epoch}: loss {loss:.4f}")
        run.info["final_loss"] = loss
        run.info["weights"] = data.mean(axis=0)  # not JSON: stored as a value
    print(f"recorded run {run.name}")
    r = casmon.load_run(run.name, STORE)
    print(r.manifest["git"]["commit"], r.manifest["status"], sorted(r.info()))


if __name__ == "__main__":
    main()
