"""CasmonCallback trains a tiny BERT with the real Trainer: the training arguments and model config as params,
every logged metric at its global step, checkpoint folders kept (deleted ones released) and loadable back, and
the run's end: ``failed`` when training raised."""

import pytest

import casmon
from tests.support.deadline import until

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning", "ignore::UserWarning", "ignore::FutureWarning",
                                        "ignore::DeprecationWarning")

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

from casmon.integrations.transformers import CasmonCallback  # noqa: E402


class Data(torch.utils.data.Dataset):
    def __init__(self, n=16):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 100, (n, 8), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(8, dtype=torch.long), "labels": self.labels[i]}


class Broken(Data):
    def __getitem__(self, i):
        raise RuntimeError("bad example")


def model():
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
                                     vocab_size=100)
    return transformers.BertForSequenceClassification(config)


def trainer(tmp_path, callback, data=None, **args):
    a = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=args.pop("max_steps", 6), per_device_train_batch_size=4,
        learning_rate=1e-3, logging_steps=1, save_steps=2, report_to=[], disable_tqdm=True, use_cpu=True,
        dataloader_num_workers=0, seed=0, **args)
    return transformers.Trainer(model=model(), args=a, train_dataset=data or Data(), callbacks=[callback])


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "store", create=True)
    yield s
    s.close()


def own(store):
    return CasmonCallback(record_options={"store": store, "capture_output": False})


def test_a_training_logs_its_arguments_config_and_every_metric_at_its_step_and_ends_ok(tmp_path, store):
    trainer(tmp_path, own(store)).train()
    r = casmon.load_run("latest", store)
    assert r.status == "ok"
    p = r.params()
    assert p["learning_rate"] == 1e-3 and p["max_steps"] == 6 and p["per_device_train_batch_size"] == 4
    assert p["model"]["hidden_size"] == 32 and p["model"]["vocab_size"] == 100
    assert list(r.metric("loss").steps) == [1, 2, 3, 4, 5, 6]
    assert list(r.metric("learning_rate").steps) == [1, 2, 3, 4, 5, 6]
    assert list(r.metric("train_runtime").steps) == [6]


def test_checkpoint_folders_are_artifacts_that_load_back_and_deleted_ones_are_released(tmp_path, store):
    trainer(tmp_path, own(store), save_total_limit=2).train()
    on_disk = sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith("checkpoint-"))
    assert on_disk == ["checkpoint-4", "checkpoint-6"]
    r = casmon.load_run("latest", store)
    assert sorted(a["name"] for a in r.artifacts()) == ["checkpoints/checkpoint-4", "checkpoints/checkpoint-6"]
    back = r.load_file("checkpoints/checkpoint-6", tmp_path / "back")
    again = transformers.BertForSequenceClassification.from_pretrained(back)
    saved = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "out" / "checkpoint-6")
    for (k, a), (_, b) in zip(again.state_dict().items(), saved.state_dict().items()):
        assert torch.equal(a, b), k
    assert (back / "trainer_state.json").exists()


def test_a_training_that_raises_ends_the_callbacks_own_run_failed(tmp_path, store):
    with pytest.raises(RuntimeError, match="bad example"):
        trainer(tmp_path, own(store), data=Broken()).train()
    until(lambda: casmon.load_run("latest", store).status != "running", "the run's end", 60)
    r = casmon.load_run("latest", store)
    assert r.status == "failed" and r.params()["max_steps"] == 6


def test_inside_a_record_it_logs_into_that_run_continuing_its_steps_and_leaves_its_end_to_it(tmp_path, store):
    with casmon.record(store=store, capture_output=False) as run:
        t = trainer(tmp_path, CasmonCallback(), max_steps=2)
        t.train()
        t.train()  # a second training logs into the same run, after the first
        trainer(tmp_path, CasmonCallback(), max_steps=2).train()  # so does a trainer made anew
        t.evaluate(Data(8))  # an evaluation logs at its trainer's last training step in the run
    r = casmon.load_run("latest", store)
    assert r.name == run.name and r.status == "ok" and len(casmon.list_runs(store)) == 1
    assert list(r.metric("loss").steps) == [1, 2, 3, 4, 5, 6]  # never back to 1: no two points at one step
    assert list(r.metric("train_runtime").steps) == [2, 4, 6] and list(r.metric("eval_loss").steps) == [4]


def test_processes_other_than_the_worlds_zero_log_nothing(tmp_path, store):
    cb = own(store)
    state = transformers.TrainerState()
    state.is_world_process_zero = False
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True)
    cb.on_train_begin(args, state, None, model=model())
    cb.on_log(args, state, None, logs={"loss": 1.0})
    cb.on_save(args, state, None)
    cb.on_train_end(args, state, None)
    assert len(casmon.list_runs(store)) == 0


def test_an_evaluation_after_training_logs_into_the_callbacks_run_at_its_last_step_and_ends_it_again(
        tmp_path, store):
    cb = own(store)
    t = trainer(tmp_path, cb, max_steps=2)
    t.train()
    t.evaluate(Data(8))  # into the training's run, as W&B and MLflow do; nothing is left running after
    t.train()  # a second training with the callback goes on in its run, after the first's steps
    runs = casmon.list_runs(store)
    assert [r.status for r in runs] == ["ok"]
    r = casmon.load_run(runs[0].name, store)
    assert list(r.metric("eval_loss").steps) == [2] and list(r.metric("loss").steps) == [1, 2, 3, 4]
    with casmon.record(store=store, capture_output=False) as run:
        t.evaluate(Data(8))  # inside a record: into that run
    assert list(casmon.load_run(run.name, store).metric("eval_loss").steps) == [2]
