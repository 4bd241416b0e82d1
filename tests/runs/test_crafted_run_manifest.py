"""A run manifest whose times or durations are NaN, infinite, negative or too large for a date -- crafted or
damaged -- lists that run as unreadable, naming why; it raises nothing but casmon's errors into ``list_runs``,
``load_run``, ``information`` or a CLI verb, and hides no other run."""

import json
import warnings

import pytest
from click.testing import CliRunner

import casmon
from casmon.cli.app import main as cli
from casmon.store.codec import KIND_REF, encode_frame, get_codec
from casmon.store.records import ref_key

BAD = [float("nan"), float("-inf"), 1e308, 10**400, -5.0]


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs") / "s"
    s = casmon.open(root, autoflush=None)
    for lr in (0.1, 0.2):
        with casmon.record(store=s, capture_output=False, params={"lr": lr}):
            casmon.log(loss=lr)
    s.flush()
    s.close()
    return root


@pytest.mark.parametrize("field", ["start", "end", "duration", "patch_time", "signal_time", "heartbeat_s"])
def test_a_run_manifest_with_an_impossible_time_is_unreadable_never_a_raw_error(template, tmp_path, field):
    import shutil

    for i, v in enumerate(BAD):
        root = tmp_path / f"s{i}"
        shutil.copytree(template, root)
        s = casmon.open(root, autoflush=None)
        ref = s.get_ref("runs/1")
        manifest = {**casmon.load_run(1, s).manifest, field: v}
        d = s.put(manifest)  # stored as JSON: NaN, infinities and a 400-digit int as written
        s.flush()
        body = json.dumps({"target": d.hex(), "data": ref.data}).encode()
        s.backend.set(ref_key("runs/1"), encode_frame(body, KIND_REF, get_codec("none"))[1])
        s.close()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runs = casmon.list_runs(casmon.open(root, read_only=True))
            assert [r.name for r in runs] == ["1", "2"] and runs[0].status == "unreadable", (field, v)
            assert field in runs[0].manifest["error"]
            repr(runs), [r.elapsed for r in runs]
            casmon.load_run(1, root).information()
            with pytest.raises(casmon.DamagedObjectError, match="runs/1"):
                casmon.load_run(1, root).metrics()
            assert casmon.load_run(2, root).information()["params"] == {"lr": 0.2}
            for verb in (["runs"], ["show", "1"], ["show", "2"], ["export", "1", str(tmp_path / f"e{i}")]):
                r = CliRunner().invoke(cli, [verb[0], "--store", str(root), *verb[1:]])
                assert r.exception is None or isinstance(r.exception, SystemExit), (field, v, verb, r.exception)
