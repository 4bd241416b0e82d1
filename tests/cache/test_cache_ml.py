"""The cache on the ML libraries' values: equal inputs hit, and no lazy or file-backed value gives a stale hit."""

import sys
import warnings

import numpy as np
import pytest

import casmon
from casmon import CacheWarning

torch = pytest.importorskip("torch") if sys.version_info < (3, 12) else None
pl = pytest.importorskip("polars")
needs_torch = pytest.mark.skipif(torch is None, reason="torch is installed on Python 3.11 only (its CPU build)")


@pytest.fixture
def store(tmp_path):
    return casmon.open(tmp_path / "s")


@needs_torch
def test_a_tensor_argument_hits_for_an_equal_tensor(store):
    calls = []

    @casmon.cache(store=store)
    def scale(t, k):
        calls.append(1)
        return t * k

    t = torch.randn(100, 10)
    first = scale(t, 2.0)
    again = scale(t.clone(), 2.0)
    assert len(calls) == 1 and torch.equal(first, again) and type(again) is torch.Tensor
    scale(t + 1e-7, 2.0)
    assert len(calls) == 2


def test_a_lazy_frame_runs_uncached_and_never_returns_an_old_answer(store, tmp_path):
    p = tmp_path / "t.parquet"
    pl.DataFrame({"a": [1, 2, 3]}).write_parquet(p)

    @casmon.cache(store=store)
    def total(lf):
        return lf.select(pl.col("a").sum()).collect().item()

    with pytest.warns(CacheWarning, match="LazyFrame"):
        assert total(pl.scan_parquet(p)) == 6
    pl.DataFrame({"a": [10, 20, 30]}).write_parquet(p)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        assert total(pl.scan_parquet(p)) == 60


def test_a_lazily_opened_netcdf_counts_the_values_it_reads(store, tmp_path):
    xr = pytest.importorskip("xarray")
    pytest.importorskip("scipy")  # xarray's netCDF3 writer
    p = tmp_path / "d.nc"
    xr.Dataset({"v": ("x", np.arange(3.0))}).to_netcdf(p)

    @casmon.cache(store=store)
    def total(ds):
        return float(ds["v"].sum())

    with xr.open_dataset(p) as ds:
        assert total(ds) == 3.0
    xr.Dataset({"v": ("x", np.arange(3.0) * 10)}).to_netcdf(p)
    with xr.open_dataset(p) as ds:
        assert total(ds) == 30.0


def test_a_memory_mapped_dataset_edited_in_place_is_not_a_stale_hit(store, tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = str(tmp_path / "ds")
    datasets.Dataset.from_dict({"a": [1, 2, 3]}).save_to_disk(folder)

    @casmon.cache(store=store)
    def total(ds):
        return sum(ds["a"])

    assert total(datasets.load_from_disk(folder)) == 6
    ds = datasets.load_from_disk(folder)
    arrow_file = ds.cache_files[0]["filename"]
    raw = open(arrow_file, "rb").read()
    needle = np.array([1, 2, 3], np.int64).tobytes()
    assert raw.count(needle) == 1
    with open(arrow_file, "r+b") as f:  # the same file, the same size, other values
        f.seek(raw.index(needle))
        f.write(np.array([4, 5, 6], np.int64).tobytes())
    assert total(datasets.load_from_disk(folder)) == 15


class Fragile:
    def __init__(self, n):
        self.n = n

    def __setstate__(self, state):
        raise RuntimeError("cannot be rebuilt here")


def test_a_cached_result_that_cannot_be_loaded_is_computed_again(store):
    calls = []

    @casmon.cache(store=store)
    def make(n):
        calls.append(n)
        return Fragile(n)

    make(1)
    with pytest.warns(CacheWarning, match="cannot be loaded"):
        assert make(1).n == 1
    assert calls == [1, 1]
