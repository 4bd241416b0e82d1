"""Functions run by worker processes (multiprocessing, Dask) in the many-writer tests.

They use the default store, so the store comes from $CASMON_STORE (and S3
credentials from the environment), as it would on a cluster.
"""

import casmon


@casmon.cache
def square(x):
    return x * x


@casmon.intercept
def log_value(i, v):
    return v


def work(i, k=20):
    r = square(i % k)
    log_value(i, r)
    return r


def flush():
    casmon.flush()
