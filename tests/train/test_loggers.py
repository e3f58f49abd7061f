"""TensorBoard / wandb loggers beside metrics.jsonl: what the trainer logs, readable by their tools."""

import importlib.util

import pytest
from pydantic import ValidationError

from harnessrl.job.config import JobConfig
from harnessrl.policy.tiny import build_tiny
from harnessrl.train import Trainer
from harnessrl.train.loggers import MissingExtraError


def _trainer(run, loggers):
    model, tokenizer = build_tiny(seed=0)
    return Trainer(model, tokenizer, run_dir=run, loggers=loggers)


def test_tensorboard_gets_every_metrics_line_at_its_line_number(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = _trainer(tmp_path, ["tensorboard"])
    trainer.log({"step": 1, "loss/sft": 0.5, "note": "text is skipped"})
    # a skipped update logs its step again
    trainer.log({"step": 1, "loss/sft": 0.25, "perf/skipped_update": 1})
    # a second trainer on the same run folder (a resume) continues the count
    resumed = _trainer(tmp_path, ["tensorboard"])
    resumed.log({"step": 2, "loss/sft": 0.125})

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    points = [(s.step, s.value) for s in events.Scalars("loss/sft")]
    assert points == [(1, 0.5), (2, 0.25), (3, 0.125)]
    assert [s.value for s in events.Scalars("step")] == [1, 1, 2]
    assert "note" not in events.Tags()["scalars"]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3


def test_wandb_offline_run_in_the_run_folder(tmp_path):
    pytest.importorskip("wandb")
    trainer = _trainer(tmp_path, ["wandb"])
    trainer.log({"step": 1, "loss/sft": 0.5})
    trainer.loggers.close()
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))


def test_a_missing_package_names_the_extra_and_fails_config_load(tmp_path, monkeypatch):
    assert JobConfig.model_validate({}).loggers == []
    with pytest.raises(ValidationError, match="loggers"):
        JobConfig.model_validate({"loggers": ["mlflow"]})
    real = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "tensorboard" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ValidationError, match=r"pip install 'harnessrl\[tensorboard\]'"):
        JobConfig.model_validate({"loggers": ["tensorboard"]})
    with pytest.raises(MissingExtraError, match=r"harnessrl\[tensorboard\]"):
        _trainer(tmp_path, ["tensorboard"])
