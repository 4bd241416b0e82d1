"""A live run's system metrics (casmon.runs.sysmetrics): sampled into ``sys/...`` on their own thread and steps.

psutil is the real one unless a test replaces it; NVML is a fake module that answers as pynvml does (no GPU
here), and the real pynvml meets no driver. Waits poll with deadlines far beyond what must happen.
"""

import os
import subprocess
import sys
import types
import warnings

import pytest

import casmon
from casmon.runs import live, load_run, sysmetrics
from tests.conftest import ROOT
from tests.support import deadline

FAST = 0.05  # seconds between samples in these tests


def _sys_names(run_info):
    return sorted(n for n in run_info.metrics() if n.startswith("sys/"))


def _samples(run, name="sys/rss_bytes"):
    """How many points of ``name`` the live run has taken so far (waiting, or written and counted)."""
    with run._metrics.lock:
        p = run._metrics.pending.get(name)
        return (len(p.steps) if p is not None else 0) + run._metrics.summary.get(name, {}).get("n", 0)


def _until(cond, what):
    return deadline.until(cond, what, 60.0)


@pytest.fixture
def no_gpu(monkeypatch):
    """No GPU and no NVML, whatever the machine has: each test says which it wants."""
    monkeypatch.setattr(sysmetrics, "_nvml", {})
    monkeypatch.setattr(sysmetrics, "gpu_present", lambda: False)
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)


@pytest.mark.filterwarnings("ignore::casmon.RunWarning")
def test_system_metrics_reach_the_store_while_the_run_goes_on(tmp_path, no_gpu):
    store = str(tmp_path / "s")
    with casmon.record(store=store, system_metrics_s=0.2, capture_output=False) as run:
        got = _until(lambda: [n for n in _sys_names(load_run(run.name, store=store))], "sys metrics in the store")
        assert {"sys/cpu_percent", "sys/rss_bytes", "sys/host_mem_percent"} <= set(got)
    info = load_run(run.name, store=store)
    rss = info.metric("sys/rss_bytes")
    assert rss.values.min() > 0 and list(rss.steps) == list(range(len(rss)))
    assert set(info.manifest["metrics"]) >= {"sys/cpu_percent", "sys/rss_bytes"}


@pytest.mark.filterwarnings("ignore::casmon.RunWarning")
def test_system_metrics_keep_their_own_steps_and_leave_the_runs_counter_alone(tmp_path, no_gpu):
    store = str(tmp_path / "s")
    with casmon.record(store=store, system_metrics_s=FAST, capture_output=False) as run:
        for i in range(5):
            _until(lambda: _samples(run) > 2 * i, "a few samples")
            run.log(loss=float(i))  # no step: the run's own counter
    info = load_run(run.name, store=store)
    assert list(info.metric("loss").steps) == [0, 1, 2, 3, 4]
    assert len(info.metric("sys/rss_bytes")) >= 9


def test_system_metrics_false_samples_nothing(tmp_path, no_gpu):
    store = str(tmp_path / "s")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say either
        with casmon.record(store=store, system_metrics=False, system_metrics_s=FAST, capture_output=False) as off:
            assert id(off) not in live._sampler.runs
            with casmon.record(store=store, system_metrics_s=FAST, capture_output=False) as on:
                _until(lambda: _samples(on) >= 3, "the sampling thread to sample the other run")
                off.log(loss=1.0)
    assert _sys_names(load_run(off.name, store=store)) == []
    assert _sys_names(load_run(on.name, store=store))


@pytest.mark.filterwarnings("ignore::casmon.RunWarning")
def test_sampling_stops_with_the_run(tmp_path, no_gpu):
    with casmon.record(store=str(tmp_path / "s"), system_metrics_s=FAST, capture_output=False) as run:
        assert id(run) in live._sampler.runs
        _until(lambda: _samples(run) >= 1, "a sample")
    assert id(run) not in live._sampler.runs
    with pytest.raises(RuntimeError):
        with casmon.record(store=str(tmp_path / "s"), system_metrics_s=FAST, capture_output=False) as failed:
            raise RuntimeError("boom")
    assert id(failed) not in live._sampler.runs


@pytest.mark.parametrize("kw, error", [
    ({"system_metrics_s": 0}, ValueError), ({"system_metrics_s": -1.0}, ValueError),
    ({"system_metrics_s": float("nan")}, ValueError), ({"system_metrics_s": float("inf")}, ValueError),
    ({"system_metrics_s": "10"}, ValueError), ({"system_metrics_s": True}, ValueError),
    ({"system_metrics_s": 1e12}, ValueError),  # beyond what the sampling thread's wait can take
    ({"system_metrics_s": 10 ** 400}, ValueError),  # beyond any float
    ({"system_metrics": "yes"}, TypeError), ({"system_metrics": None}, TypeError),
])
def test_a_bad_system_metrics_option_is_one_clear_error(kw, error):
    with pytest.raises(error, match=r"casmon.record: system_metrics"):
        casmon.record(**kw)


@pytest.mark.filterwarnings("ignore::casmon.RunWarning")
def test_an_interval_from_numpy_or_a_config_is_taken_as_its_number(tmp_path, no_gpu):
    import fractions

    import numpy as np

    for every, want in ((np.float64(2.5), 2.5), (np.float32(0.25), 0.25), (np.int64(3), 3.0),
                        (fractions.Fraction(1, 20), 0.05)):
        got = sysmetrics.interval(True, every, "here")
        assert type(got) is float and got == want
    with casmon.record(store=str(tmp_path / "s"), system_metrics_s=np.float64(FAST), capture_output=False) as run:
        _until(lambda: _samples(run) >= 2, "samples at a numpy interval")
    with pytest.raises(ValueError, match="system_metrics_s must be a number"):
        sysmetrics.interval(True, np.float64("nan"), "here")


MISSING = r"""
import sys, warnings
sys.modules["psutil"] = None  # as if it were not installed
warnings.simplefilter("always")
if sys.argv[2] == "error":  # the line itself made an error: the run still starts and ends
    warnings.filterwarnings("error", message="casmon.record: system metrics")
import casmon
from casmon.runs import sysmetrics
sysmetrics.gpu_present = lambda: False
with casmon.record(store=sys.argv[1], system_metrics_s=0.01, capture_output=False) as run:
    for i in range(50):
        run.log(loss=i)
print("status", casmon.runs.load_run(run.name, store=sys.argv[1]).status)
"""


@pytest.mark.parametrize("warnings_are", ["always", "error"])
def test_a_missing_psutil_is_one_line_at_the_run_start_and_never_an_error(tmp_path, warnings_are):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", MISSING, str(tmp_path / "s"), warnings_are], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "status ok" in p.stdout
    said = [line for line in p.stderr.splitlines() if "psutil" in line]
    assert len(said) == 1, p.stderr
    assert "RunWarning" in said[0] and "casmon[system]" in said[0]


class _FlakyPsutil(types.ModuleType):
    """psutil whose readings start failing after a few samples: cpu_percent raises, virtual_memory too."""

    def __init__(self, real, good):
        super().__init__("psutil")
        self.real, self.good = real, good
        self.calls = 0
        outer = self

        class Process:
            def __init__(self):
                self.p = real.Process()

            def cpu_percent(self, interval=None):
                outer.calls += 1
                if outer.calls > outer.good:
                    raise real.AccessDenied(os.getpid())
                return self.p.cpu_percent(interval)

            def memory_info(self):
                return self.p.memory_info()

        self.Process = Process

    def __getattr__(self, name):  # psutil's own code reads its module's settings (PROCFS_PATH)
        return getattr(self.real, name)

    def virtual_memory(self):
        if self.calls > self.good:
            raise OSError("/proc/meminfo went away")
        return self.real.virtual_memory()

    def disk_io_counters(self):
        return None  # as in a container that shows no disks

    def net_io_counters(self):
        return self.real.net_io_counters()


def test_a_psutil_that_fails_mid_run_does_not_stop_the_run_nor_the_other_metrics(tmp_path, monkeypatch, no_gpu):
    import psutil

    flaky = _FlakyPsutil(psutil, good=3)
    monkeypatch.setitem(sys.modules, "psutil", flaky)
    store = str(tmp_path / "s")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with casmon.record(store=store, system_metrics_s=FAST, capture_output=False) as run:
            _until(lambda: _samples(run) >= 8, "samples after psutil began to fail")
            run.log(loss=1.0)
    info = load_run(run.name, store=store)
    assert info.status == "ok"
    assert len(info.metric("sys/rss_bytes")) >= 8
    assert 1 <= len(info.metric("sys/cpu_percent")) <= 3  # the sample priming the rates is the first good call
    assert "sys/disk_read_bytes_per_s" not in info.metrics()
    said = [w for w in caught if issubclass(w.category, casmon.RunWarning)]
    assert len(said) == 1 and "could not be read" in str(said[0].message), [str(w.message) for w in said]


def test_a_reading_that_fails_under_warnings_as_errors_is_still_said_once(tmp_path, monkeypatch, capsys, no_gpu):
    import psutil

    monkeypatch.setitem(sys.modules, "psutil", _FlakyPsutil(psutil, good=3))
    store = str(tmp_path / "s")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # -W error: the sampling thread's warning would raise there
        with casmon.record(store=store, system_metrics_s=FAST, capture_output=False) as run:
            _until(lambda: _samples(run) >= 8, "samples after psutil began to fail")
    said = [line for line in capsys.readouterr().err.splitlines() if "could not be read" in line]
    assert len(said) == 1 and "RunWarning" in said[0], said
    info = load_run(run.name, store=store)
    assert info.status == "ok"
    assert len(info.metric("sys/rss_bytes")) >= 8


class _NVMLError(Exception):
    pass


class _NotSupported(_NVMLError):
    pass


def _fake_pynvml(count=2, fail_init=None):
    """A module answering as pynvml does, for ``count`` GPUs; GPU 1 has no power reading (NotSupported)."""
    m = types.ModuleType("pynvml")
    m.NVML_TEMPERATURE_GPU = 0
    m.NVMLError = _NVMLError
    m.NVMLError_NotSupported = _NotSupported
    m.inits = 0

    def nvmlInit():
        m.inits += 1
        if fail_init is not None:
            raise fail_init

    def power(h):
        if h == 1:
            raise _NotSupported("Not Supported")
        return 250_500  # milliwatts

    m.nvmlInit = nvmlInit
    m.nvmlDeviceGetCount = lambda: count
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=40 + h, memory=10)
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=(h + 1) << 30, total=80 << 30, free=0)
    m.nvmlDeviceGetPowerUsage = power
    m.nvmlDeviceGetTemperature = lambda h, sensor: 60 + h if sensor == 0 else -1
    return m


def test_each_gpu_nvml_sees_is_sampled(tmp_path, monkeypatch, no_gpu):
    fake = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    store = str(tmp_path / "s")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a GPU without a power reading is not worth a line
        with casmon.record(store=store, system_metrics_s=FAST, capture_output=False) as run:
            _until(lambda: _samples(run, "sys/gpu1/temp_c") >= 2, "GPU samples")
        with casmon.record(store=store, system_metrics_s=FAST, capture_output=False) as second:
            _until(lambda: _samples(second, "sys/gpu0/temp_c") >= 1, "GPU samples of a second run")
    assert fake.inits == 1  # once per process
    m = load_run(run.name, store=store).metrics()
    assert m["sys/gpu0/util_percent"].values[0] == 40 and m["sys/gpu1/util_percent"].values[0] == 41
    assert m["sys/gpu0/mem_bytes"].values[0] == 1 << 30 and m["sys/gpu1/mem_bytes"].values[0] == 2 << 30
    assert m["sys/gpu0/power_w"].values[0] == 250.5 and "sys/gpu1/power_w" not in m
    assert m["sys/gpu0/temp_c"].values[0] == 60 and m["sys/gpu1/temp_c"].values[0] == 61


def test_a_gpu_that_fails_mid_run_is_said_once_and_sampling_goes_on(tmp_path, monkeypatch, no_gpu):
    fake = _fake_pynvml(count=1)
    reads = []

    def temperature(h, sensor):
        reads.append(h)
        if len(reads) > 2:
            raise _NVMLError("GPU is lost")
        return 70

    fake.nvmlDeviceGetTemperature = temperature
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    store = str(tmp_path / "s")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with casmon.record(store=store, system_metrics_s=FAST, capture_output=False) as run:
            _until(lambda: len(reads) >= 6 and _samples(run, "sys/gpu0/util_percent") >= 6, "samples after the loss")
    m = load_run(run.name, store=store).metrics()
    assert len(m["sys/gpu0/temp_c"]) == 1  # the priming read and one sample; none after the loss
    said = [str(w.message) for w in caught if issubclass(w.category, casmon.RunWarning)]
    assert len(said) == 1 and "GPU is lost" in said[0], said


def test_nvml_without_a_driver_is_one_line_then_silent(tmp_path, monkeypatch, no_gpu):
    pytest.importorskip("pynvml")  # the real nvidia-ml-py: no driver on the test machines
    monkeypatch.setattr(sysmetrics, "gpu_present", lambda: True)
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - what this test wants: no driver
        pass
    else:
        pytest.skip("this machine has an NVIDIA driver")
    monkeypatch.setattr(sysmetrics, "_nvml", {})
    store = str(tmp_path / "s")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with casmon.record(store=store, system_metrics_s=FAST, capture_output=False) as run:
            _until(lambda: _samples(run) >= 5, "samples")
    said = [str(w.message) for w in caught if issubclass(w.category, casmon.RunWarning)]
    assert len(said) == 1 and "NVML cannot be used" in said[0], said
    assert not [n for n in load_run(run.name, store=store).metrics() if n.startswith("sys/gpu")]


def test_a_missing_pynvml_where_a_gpu_is_present_is_one_line(tmp_path, monkeypatch, no_gpu):
    monkeypatch.setattr(sysmetrics, "gpu_present", lambda: True)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.warns(casmon.RunWarning, match=r"nvidia-ml-py is not installed") as caught:
        with casmon.record(store=str(tmp_path / "s"), system_metrics_s=FAST, capture_output=False):
            pass
    assert len([w for w in caught if issubclass(w.category, casmon.RunWarning)]) == 1


@pytest.mark.parametrize("fails", ["raise FutureWarning('the pynvml package is deprecated')",  # -W error, pynvml 12
                                   "raise RuntimeError('libnvidia-ml.so.1: cannot open shared object file')"])
def test_a_pynvml_that_fails_to_import_leaves_the_host_metrics_sampled_and_is_one_line(tmp_path, monkeypatch, fails,
                                                                                      no_gpu):
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "pynvml.py").write_text(fails + "\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    monkeypatch.setattr(sysmetrics, "gpu_present", lambda: True)
    store = str(tmp_path / "s")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with casmon.record(store=store, system_metrics_s=FAST, capture_output=False) as run:
            _until(lambda: _samples(run) >= 2, "host samples")
    said = [str(w.message) for w in caught if issubclass(w.category, casmon.RunWarning)]
    assert len(said) == 1 and "nvidia-ml-py cannot be imported" in said[0] and "no GPU metrics" in said[0], said
    assert "sys/rss_bytes" in load_run(run.name, store=store).metrics()


def test_a_psutil_that_fails_to_import_leaves_the_gpus_sampled_and_is_one_line(tmp_path, monkeypatch, no_gpu):
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "psutil.py").write_text("raise DeprecationWarning('this psutil is deprecated')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    monkeypatch.delitem(sys.modules, "psutil", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(count=1))
    store = str(tmp_path / "s")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with casmon.record(store=store, system_metrics_s=FAST, capture_output=False) as run:
            _until(lambda: _samples(run, "sys/gpu0/util_percent") >= 2, "GPU samples")
    said = [str(w.message) for w in caught if issubclass(w.category, casmon.RunWarning)]
    assert len(said) == 1 and "psutil cannot be imported" in said[0], said


def test_no_gpu_imports_no_nvml_and_says_nothing(tmp_path, no_gpu):
    with warnings.catch_warnings(record=True) as caught:  # not "error": casmon writes a warning made an error
        warnings.simplefilter("always")
        with casmon.record(store=str(tmp_path / "s"), system_metrics_s=FAST, capture_output=False) as run:
            _until(lambda: _samples(run) >= 1, "a sample")
    assert not [str(w.message) for w in caught if issubclass(w.category, casmon.RunWarning)]
    assert "pynvml" not in sys.modules


@pytest.mark.filterwarnings("ignore::casmon.RunWarning")
def test_a_resumed_run_continues_its_sample_steps_and_its_own_counter(tmp_path, no_gpu):
    store = str(tmp_path / "s")
    with pytest.raises(RuntimeError):
        with casmon.record(store=store, system_metrics_s=FAST, capture_output=False) as run:
            for i in range(3):
                run.log(loss=float(i))
            _until(lambda: _samples(run) >= 10, "samples above the run's own steps")
            raise RuntimeError("preempted")
    first = len(load_run(run.name, store=store).metric("sys/rss_bytes"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with casmon.record(store=store, resume=run.name, system_metrics_s=FAST, capture_output=False) as again:
            again.log(loss=3.0)
            _until(lambda: _samples(again) >= first + 2, "samples of the resumed run")
    info = load_run(run.name, store=store)
    assert list(info.metric("loss").steps) == [0, 1, 2, 3]
    steps = list(info.metric("sys/rss_bytes").steps)
    assert steps == list(range(len(steps)))
    assert not [w for w in caught if "skipped" in str(w.message)]


def test_system_metrics_never_push_the_users_metrics_out_of_a_live_runs_ref(tmp_path, monkeypatch, no_gpu):
    from casmon.runs.metrics import REF_SUMMARY_MAX

    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(count=8))  # a GPU node: 32 sys/gpu metrics
    store = str(tmp_path / "s")
    user = [f"train/m{i:02d}" for i in range(REF_SUMMARY_MAX)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with casmon.record(store=store, system_metrics_s=FAST, capture_output=False) as run:
            _until(lambda: _samples(run, "sys/gpu7/temp_c") >= 1, "GPU samples")
            run.log({name: 1.0 for name in user})
            casmon.store.store.default_store(store).flush()
            live_names = _until(lambda: (s := set(run._metrics.ref_summary())) >= set(user) and s,
                                "the user's metrics in the ref")
    assert not [n for n in live_names if n.startswith("sys/")]  # every slot went to the user's metrics


def test_a_diff_lists_the_users_metrics_before_system_metrics(tmp_path):
    store = str(tmp_path / "s")
    for i in range(2):
        with casmon.record(store=store, capture_output=False, system_metrics=False) as run:
            run.log({"val/zeta": float(i), "sys/cpu_percent": 10.0 * i})  # as sampled
    assert list(casmon.diff("1", "2", store)["metrics"]) == ["val/zeta", "sys/cpu_percent"]


def test_a_forked_child_opens_nvml_though_the_parent_held_its_lock_at_the_fork(monkeypatch, no_gpu):
    from tests.support.deadline import within

    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(count=1))
    held = sysmetrics._lock()
    held.acquire()  # another thread of the parent was opening NVML when the process forked
    try:
        real = os.getpid()
        monkeypatch.setattr(sysmetrics.os, "getpid", lambda: real + 1)  # in the child
        gpus, why = within(30, sysmetrics._open_gpus)
        assert why is None and len(gpus.handles) == 1
    finally:
        held.release()


OFF = r"""
import sys, threading
import casmon
with casmon.record(store=sys.argv[1], system_metrics=False, capture_output=False) as run:
    run.log(loss=1.0)
    print(sorted(t.name for t in threading.enumerate() if "sysmetrics" in t.name))
"""


def test_system_metrics_false_starts_no_sampling_thread(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", OFF, str(tmp_path / "s")], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


@pytest.mark.filterwarnings("ignore::casmon.RunWarning")
def test_many_runs_at_once_share_one_sampling_thread(tmp_path, no_gpu):
    import threading

    store = str(tmp_path / "s")
    started, go = threading.Barrier(21), threading.Event()
    names = []

    def one():
        with casmon.record(store=store, system_metrics_s=FAST, capture_output=False) as run:
            names.append(run.name)
            started.wait(60)
            _until(lambda: _samples(run) >= 2, "this run's samples")
            go.wait(60)

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    started.wait(60)
    try:
        assert [t.name for t in threading.enumerate()].count("casmon-run-sysmetrics") == 1
    finally:
        go.set()
        for t in threads:
            t.join(120)
    assert len(names) == 20
    for name in names:
        assert "sys/rss_bytes" in load_run(name, store=store).metrics()


def test_nvml_imported_by_another_library_on_a_machine_without_a_gpu_says_nothing(tmp_path, monkeypatch, no_gpu):
    # torch imports pynvml on CPU-only machines too: a failing NVML there is no news, not a line per run
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(fail_init=_NVMLError("NVML Shared Library Not Found")))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with casmon.record(store=str(tmp_path / "s"), system_metrics_s=FAST, capture_output=False) as run:
            _until(lambda: _samples(run) >= 1, "a sample")
    assert not [str(w.message) for w in caught if issubclass(w.category, casmon.RunWarning)]
    assert not [n for n in load_run(run.name, store=str(tmp_path / "s")).metrics() if n.startswith("sys/gpu")]
