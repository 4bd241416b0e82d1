"""Ctrl-C (or any exception) at any step of a flush loses nothing: what was not written is written by the next."""

import warnings

import pytest

import casmon
from casmon import faultpoints

WRITER_STEPS = ["flush.sealed", "flush.after_pack", "flush.after_index", "flush.after_records"]


@pytest.mark.parametrize("step", WRITER_STEPS)
def test_an_interrupt_at_any_flush_step_loses_no_value_or_record(tmp_path, step):
    loc = str(tmp_path / "s")
    s = casmon.open(loc, autoflush=None)
    small = s.put("a small value, packed")
    s.append("job", {"n": 1}, refs=[small])
    faultpoints.configure(f"{step}@1=interrupt")
    try:
        with pytest.raises(KeyboardInterrupt):
            s.flush()
    finally:
        faultpoints.configure(None)
    s.append("job", {"n": 2}, refs=[s.put("another")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "values were removed ... records not written"
        s.flush()
    s.close()
    again = casmon.open(loc, read_only=True)
    assert again.get(small) == "a small value, packed"
    assert sorted(r["n"] for _d, r in again.records("job")) == [1, 2]
    again.close()
