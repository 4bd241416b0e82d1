"""CasmonLogger trains a tiny Lightning model: params, every metric with its step, checkpoints kept and released
as ModelCheckpoint keeps and deletes them, and the run's end status from the trainer's."""

import io

import pytest

import casmon

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning", "ignore::UserWarning", "ignore::DeprecationWarning")

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from casmon.integrations.lightning import CasmonLogger  # noqa: E402


class Tiny(pl.LightningModule):
    def __init__(self, lr=0.05, hidden=8, fail_at=None):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def training_step(self, batch, i):
        if self.hparams.fail_at is not None and self.global_step == self.hparams.fail_at:
            raise ValueError("diverged")
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, i):
        x, y = batch
        self.log("val/loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    ds = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    return torch.utils.data.DataLoader(ds, batch_size=8, num_workers=0)


def trainer(tmp_path, logger, epochs=3, **ckpt):
    callbacks = [pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", **ckpt)] if ckpt else []
    return pl.Trainer(max_epochs=epochs, logger=logger, callbacks=callbacks, enable_checkpointing=bool(ckpt),
                      enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                      default_root_dir=tmp_path, accelerator="cpu", devices=1)


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "store", create=True)
    yield s
    s.close()


def own(store):
    return CasmonLogger(record_options={"store": store, "capture_output": False})


def test_a_fit_logs_params_every_metric_at_its_step_and_ends_ok(tmp_path, store):
    logger = own(store)
    trainer(tmp_path, logger).fit(Tiny(), loader(), loader())
    r = casmon.load_run("latest", store)
    assert r.status == "ok" and r.name == logger.version
    assert r.params()["lr"] == 0.05 and r.params()["hidden"] == 8
    loss = r.metric("train/loss")
    assert list(loss.steps) == list(range(12)) and all(v > 0 for v in loss.values)  # 4 batches x 3 epochs
    assert list(r.metric("val/loss").steps) == [3, 7, 11]
    assert list(r.metric("epoch").steps)[-1] == 11


def test_the_checkpoints_kept_are_artifacts_that_load_back_and_deleted_ones_are_released(tmp_path, store):
    logger = own(store)
    trainer(tmp_path, logger, epochs=4, monitor="val/loss", save_top_k=2, save_last=True,
            filename="{epoch}-{step}").fit(Tiny(), loader(), loader())
    on_disk = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert len(on_disk) == 3 and "last.ckpt" in on_disk
    r = casmon.load_run("latest", store)
    kept = sorted(a["name"] for a in r.artifacts())
    assert kept == sorted(f"checkpoints/{n}" for n in on_disk)  # the deleted ones released
    for name in on_disk:
        back = r.load_file(f"checkpoints/{name}", tmp_path / "back" / name)
        state = torch.load(io.BytesIO(back.read_bytes()), weights_only=False)
        assert state["state_dict"].keys() == Tiny().state_dict().keys()
        Tiny.load_from_checkpoint(back)
    last = torch.load(tmp_path / "back" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 16


def test_a_training_that_raises_ends_the_loggers_own_run_failed(tmp_path, store):
    with pytest.raises(ValueError, match="diverged"):
        trainer(tmp_path, own(store)).fit(Tiny(fail_at=5), loader())
    r = casmon.load_run("latest", store)
    assert r.status == "failed" and "diverged" in r.manifest["error"]
    assert list(r.metric("train/loss").steps) == [0, 1, 2, 3, 4]


def test_inside_a_record_it_logs_into_that_run_and_leaves_its_end_to_it(tmp_path, store):
    with casmon.record(store=store, capture_output=False) as run:
        trainer(tmp_path, CasmonLogger(), epochs=1).fit(Tiny(), loader())
        run.log(after=1.0)  # the run goes on after fit
    r = casmon.load_run("latest", store)
    assert r.name == run.name and r.status == "ok" and len(casmon.list_runs(store)) == 1
    assert list(r.metric("train/loss").steps) == [0, 1, 2, 3] and r.params()["lr"] == 0.05


def test_fits_in_one_run_continue_its_steps_and_a_validation_after_them_logs_at_the_last(tmp_path, store):
    with casmon.record(store=store, capture_output=False):
        t = trainer(tmp_path, CasmonLogger(), epochs=1)
        t.fit(Tiny(), loader())
        trainer(tmp_path, CasmonLogger(), epochs=1).fit(Tiny(), loader())  # a trainer made anew starts at step 0
        t.validate(Tiny(), loader())
    r = casmon.load_run("latest", store)
    assert list(r.metric("train/loss").steps) == list(range(8))  # never back to 0: no two points at one step
    assert list(r.metric("val/loss").steps) == [8]


def test_a_given_run_is_logged_into(tmp_path, store):
    with casmon.record(store=store, capture_output=False) as run:
        with casmon.record(store=store, capture_output=False):
            trainer(tmp_path, CasmonLogger(run=run), epochs=1).fit(Tiny(), loader())
    assert list(casmon.load_run(run.name, store).metric("train/loss").steps) == [0, 1, 2, 3]


def test_a_wrong_run_or_record_option_is_a_clear_error_at_once():
    with pytest.raises(TypeError, match="run must be a casmon Run"):
        CasmonLogger(run="r1")
    with pytest.raises(ValueError, match="capture_output"):
        CasmonLogger(record_options={"capture_output": "nope"})


def test_a_store_error_saving_a_checkpoint_is_a_warning_and_training_goes_on(tmp_path, store, monkeypatch):
    from casmon.errors import StoreError
    from casmon.runs import artifacts

    def refuse(*a, **k):
        raise StoreError("disk full")

    monkeypatch.setattr(artifacts, "save_file", refuse)
    with pytest.warns(casmon.RunWarning, match="could not save checkpoint .*disk full"):
        trainer(tmp_path, own(store), epochs=2, save_top_k=1).fit(Tiny(), loader())
    r = casmon.load_run("latest", store)
    assert r.status == "ok" and r.artifacts() == [] and list(r.metric("train/loss").steps) == list(range(8))


def test_ranks_other_than_zero_open_no_run_and_log_nothing(tmp_path, store, monkeypatch):
    from lightning.pytorch.utilities import rank_zero_only

    monkeypatch.setattr(rank_zero_only, "rank", 1)
    logger = own(store)
    logger.log_hyperparams({"lr": 1})
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.finalize("success")
    assert logger.version is None
    logger.experiment.log(x=1)  # does nothing, as on Lightning's own loggers
    assert len(casmon.list_runs(store)) == 0


def test_a_keyboard_interrupt_reads_killed(tmp_path, store):
    class Interrupted(Tiny):
        def training_step(self, batch, i):
            if self.global_step == 2:
                raise KeyboardInterrupt
            return super().training_step(batch, i)

    import signal

    before = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit):  # Lightning ends the process on Ctrl-C
            trainer(tmp_path, own(store)).fit(Interrupted(), loader())
    finally:
        signal.signal(signal.SIGINT, before)  # Lightning ignores Ctrl-C from then on
    assert casmon.load_run("latest", store).status == "killed"


class Tested(Tiny):
    def test_step(self, batch, i):
        x, y = batch
        self.log("test/loss", torch.nn.functional.mse_loss(self.net(x), y))


def test_a_loggers_fit_validate_and_test_log_into_its_one_run_as_lightnings_own_loggers_do(tmp_path, store):
    logger = own(store)
    t = trainer(tmp_path, logger, epochs=1)
    t.fit(Tiny(), loader(), loader())
    first = logger.version
    assert casmon.load_run(first, store).status == "ok"  # ended with the fit: nothing is left running between
    t.validate(Tiny(), loader())
    t.test(Tested(), loader())
    trainer(tmp_path, logger, epochs=1).fit(Tiny(), loader())  # a second fit goes on after the first's steps
    runs = casmon.list_runs(store)
    assert [r.status for r in runs] == ["ok"] and logger.version == first
    r = casmon.load_run(first, store)
    assert list(r.metric("val/loss").steps) == [3, 4]  # the fit's, then the validation's at the trainer's step
    assert list(r.metric("test/loss").steps) == [5]  # after the validation's step: no two "epoch" points at 4
    assert list(r.metric("train/loss").steps) == [0, 1, 2, 3, 6, 7, 8, 9] and r.params()["lr"] == 0.05


def test_where_pytorch_lightning_is_the_one_imported_the_logger_is_its_logger(tmp_path):
    pytest.importorskip("pytorch_lightning")
    import subprocess
    import sys
    import textwrap

    from tests.support.processes import ROOT

    script = textwrap.dedent(f"""
        import torch, pytorch_lightning as pl, casmon
        from casmon.integrations.lightning import CasmonLogger
        assert issubclass(CasmonLogger, pl.loggers.Logger)

        class M(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Linear(2, 1)
            def training_step(self, batch, i):
                loss = self.net(batch[0]).pow(2).mean()
                self.log("loss", loss)
                return loss
            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(8, 2)), batch_size=4)
        logger = CasmonLogger(record_options={{"store": {str(tmp_path / "s")!r}, "capture_output": False}})
        pl.Trainer(max_epochs=1, logger=logger, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, log_every_n_steps=1, default_root_dir={str(tmp_path)!r}).fit(M(), data)
        print(casmon.load_run("latest", {str(tmp_path / "s")!r}).metric("loss").steps.tolist())
    """)
    casmon.open(tmp_path / "s", create=True).close()
    p = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == "[0, 1]"


def test_checkpoints_in_the_loggers_own_folder_stay_out_of_later_runs_patches(tmp_path, store, monkeypatch):
    import subprocess

    repo = tmp_path / "project"
    repo.mkdir()
    for args in (["init", "-q", "-b", "main"], ["-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q",
                                                "--allow-empty", "-m", "first"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    monkeypatch.chdir(repo)
    t = pl.Trainer(max_epochs=1, logger=CasmonLogger(record_options={"store": store}), enable_progress_bar=False,
                   enable_model_summary=False, default_root_dir=repo, accelerator="cpu", devices=1)
    t.fit(Tiny(), loader())
    written = list((repo / "casmon").rglob("*.ckpt"))
    assert written, "Lightning wrote its checkpoint under the logger's own folder"
    assert casmon.load_run("latest", store).artifacts()  # and the run keeps it
    with casmon.record(store=store, capture_output=False) as later:
        pass
    assert casmon.load_run(later.name, store).manifest["git"]["untracked"] == []
