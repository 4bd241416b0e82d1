"""gc counts the unreachable values put lately: a `store.put` that nothing names, which it will remove."""

import numpy as np

import casmon


def test_gc_counts_values_put_within_a_day_that_nothing_names(tmp_path):
    with casmon.open(tmp_path / "s", create=True) as s:
        loose = s.put(np.arange(5000))
        kept = s.put(np.arange(6000))
        s.set_ref("keep/this", kept)
        s.flush()
        rep = s.gc(dry_run=True)
        assert rep.recent_values == 1 and rep.as_dict()["recent_values"] == 1
        s.set_ref("keep/that", loose)
        assert s.gc(dry_run=True).recent_values == 0
