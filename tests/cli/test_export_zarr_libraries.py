"""``casmon export --zarr`` run as its own process (nothing imported but casmon): a cached DataFrame or xarray
Dataset is written as its column arrays, as the README shows, not as a group describing it."""

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import zarr

import casmon


def test_the_cli_export_writes_a_cached_frame_and_dataset_as_arrays_in_a_process_that_imported_neither(tmp_path):
    xr = pytest.importorskip("xarray")
    store = tmp_path / "s"
    with casmon.open(store) as s:
        @casmon.cache(store=s)
        def frame():
            return pd.DataFrame({"name": pd.array(["a", "b", None], dtype="string"), "x": [1.0, 2.0, 3.0]})

        @casmon.cache(store=s)
        def dataset():
            return xr.Dataset({"v": ("t", np.arange(4.0))}, coords={"t": np.arange(4)})

        frame(), dataset()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "casmon.cli", "export", "--zarr", str(out), "--store", str(store)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    root = zarr.open_group(out, mode="r")
    groups = dict(root.members(max_depth=None))
    frames = [p for p, n in groups.items() if isinstance(n, zarr.Group) and "name" in n and "x" in n]
    datasets = [p for p, n in groups.items() if isinstance(n, zarr.Group) and "v" in n and "t" in n]
    assert frames and datasets, sorted(groups)
    assert list(root[frames[0]]["x"][:]) == [1.0, 2.0, 3.0]
