"""A run manifest whose ``resumes`` list was crafted: resuming it, and reading it, raise casmon errors at worst."""

import pytest

import casmon

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


@pytest.mark.parametrize("entries", [[{"claim": [1], "time": float("nan"), "status": 3}], [{"claim": {"a": 1}}],
                                     [{"claim": 1.5}, "x", None, {"claim": 10**400}]],
                         ids=["list-claim", "dict-claim", "odd-claims"])
def test_a_run_with_crafted_resume_entries_resumes_and_lists_them_as_it_can(tmp_path, entries):
    s = casmon.open(tmp_path / "s", create=True)
    with pytest.raises(RuntimeError), casmon.record(store=s, capture_output=False) as run:
        run.log(x=1.0)
        raise RuntimeError("preempted")
    m = dict(casmon.load_run(run.name, s).manifest)
    m["resumes"] = entries
    s.set_ref(run.ref, s.put(m), s.get_ref(run.ref).data)
    with casmon.record(store=s, resume=run.name, capture_output=False) as again:
        again.log(x=2.0)
    r = casmon.load_run(run.name, s)
    assert list(r.metric("x").values) == [1.0, 2.0] and r.status == "ok"
