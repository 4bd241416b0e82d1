"""CasmonCallback fits a tiny Keras model: batch metrics at the global batch index, epoch metrics at the epoch,
the optimizer's config and fit's arguments as params, and the run's end: ``failed`` when fit raised."""

import numpy as np
import pytest

import casmon
from tests.support.deadline import until

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning", "ignore::UserWarning", "ignore::DeprecationWarning")

keras = pytest.importorskip("keras")

from casmon.integrations.keras import CasmonCallback  # noqa: E402


def model(lr=0.01):
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    m.compile(optimizer=keras.optimizers.Adam(learning_rate=lr), loss="mse", metrics=["mae"])
    return m


def data(n=32):
    x = np.random.default_rng(0).normal(size=(n, 4)).astype("float32")
    return x, x.sum(1, keepdims=True)


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "store", create=True)
    yield s
    s.close()


def own(store, **kw):
    return CasmonCallback(record_options={"store": store, "capture_output": False}, **kw)


def test_a_fit_logs_batch_and_epoch_metrics_at_their_steps_and_its_params_and_ends_ok(store):
    x, y = data()
    model().fit(x, y, batch_size=8, epochs=3, validation_split=0.25, verbose=0, callbacks=[own(store)])
    r = casmon.load_run("latest", store)
    assert r.status == "ok"
    assert list(r.metric("batch/loss").steps) == list(range(9))  # 3 batches of 8 (24 kept from validation) x 3
    assert list(r.metric("batch/mae").steps) == list(range(9))
    for name in ("epoch/loss", "epoch/mae", "epoch/val_loss", "epoch/val_mae"):
        assert list(r.metric(name).steps) == [0, 1, 2], name
    p = r.params()
    assert p["fit"]["epochs"] == 3 and p["fit"]["steps"] == 3
    assert p["optimizer"]["name"] == "adam" and p["optimizer"]["learning_rate"] == pytest.approx(0.01)


def test_without_batches_only_epochs_are_logged(store):
    x, y = data()
    model().fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[own(store, batches=False)])
    r = casmon.load_run("latest", store)
    assert set(r.metric_summary()) == {"epoch/loss", "epoch/mae"}


class Boom(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 1:
            raise RuntimeError("diverged")


def test_a_fit_that_raises_ends_the_callbacks_own_run_failed(store):
    x, y = data()
    with pytest.raises(RuntimeError, match="diverged"):
        model().fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[own(store), Boom()])
    until(lambda: casmon.load_run("latest", store).status != "running", "the run's end", 60)
    r = casmon.load_run("latest", store)
    assert r.status == "failed" and list(r.metric("batch/loss").steps) == [0, 1]


def test_inside_a_record_two_fits_log_into_that_run_and_their_steps_continue(store):
    x, y = data()
    with casmon.record(store=store, capture_output=False) as run:
        cb = CasmonCallback()
        m = model()
        m.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[cb])
        m.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[cb])
        m.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[CasmonCallback()])  # a callback made anew too
    r = casmon.load_run("latest", store)
    assert r.name == run.name and r.status == "ok" and len(casmon.list_runs(store)) == 1
    assert list(r.metric("epoch/loss").steps) == [0, 1, 2]  # never back to 0: no two points at one step
    assert list(r.metric("batch/loss").steps) == list(range(12))


def test_a_fit_from_an_initial_epoch_logs_its_batches_at_that_epochs_global_index(store):
    x, y = data()
    with casmon.record(store=store, capture_output=False):
        m = model()
        m.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[CasmonCallback()])
        m.fit(x, y, batch_size=8, epochs=4, initial_epoch=2, verbose=0, callbacks=[CasmonCallback()])
    m.fit(x, y, batch_size=8, epochs=2, initial_epoch=1, verbose=0, callbacks=[own(store)])
    first, second = casmon.list_runs(store)
    a = casmon.load_run(first.name, store)
    assert list(a.metric("epoch/loss").steps) == [0, 1, 2, 3] and list(a.metric("batch/loss").steps) == list(range(16))
    b = casmon.load_run(second.name, store)
    assert list(b.metric("epoch/loss").steps) == [1] and list(b.metric("batch/loss").steps) == [4, 5, 6, 7]


def test_one_callback_fitting_twice_logs_into_its_one_run_the_second_fit_after_the_first(store):
    x, y = data()
    cb = own(store)
    m = model()
    m.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[cb])
    assert casmon.load_run("latest", store).status == "ok"  # ended with the fit: nothing is left running between
    m.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[cb])
    runs = casmon.list_runs(store)
    assert [r.status for r in runs] == ["ok"]
    r = casmon.load_run(runs[0].name, store)
    assert list(r.metric("epoch/loss").steps) == [0, 1, 2] and list(r.metric("batch/loss").steps) == list(range(12))
