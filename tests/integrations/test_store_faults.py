"""A training logging into a store on S3 that goes away mid-training (a fault proxy before moto) finishes, and
its run is whole once the store is back: no storage error reaches the training."""

import time

import numpy as np
import pytest

import casmon

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning", "ignore::RuntimeWarning", "ignore::UserWarning",
                                        "ignore::DeprecationWarning")

keras = pytest.importorskip("keras")

from casmon.integrations.keras import CasmonCallback  # noqa: E402


def test_a_fit_through_an_s3_outage_finishes_and_its_run_is_whole_when_the_store_is_back(s3_proxy, moto_server):
    proxy, bucket = s3_proxy
    store = casmon.open(f"s3://{bucket}/s", create=True)
    store.backend.retrier.seconds = 0.5

    class Outage(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                proxy.outage(3.0, "503")

    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    m.compile(optimizer="sgd", loss="mse")
    x = np.ones((16, 2), "float32")
    cb = CasmonCallback(record_options={"store": store, "capture_output": False})
    m.fit(x, x[:, :1], batch_size=8, epochs=3, verbose=0, callbacks=[cb, Outage()])
    time.sleep(3.0)  # the store is back
    m.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=[cb])  # the callback's run goes on
    store.flush()
    direct = casmon.open(f"s3://{bucket}/s", storage_options={"endpoint": moto_server}, create=False)
    runs = casmon.list_runs(direct)
    assert [r.status for r in runs] == ["ok"]
    assert list(casmon.load_run(runs[0].name, direct).metric("epoch/loss").steps) == [0, 1, 2, 3]
