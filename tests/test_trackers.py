"""``report_to``: the same scalars reach W&B (offline) and MLflow (file store) through their
own libraries, read back with those libraries."""

from __future__ import annotations

import sys

import pytest

from provrl.report.metrics import MetricsWriter


def test_mlflow_run_holds_every_logged_scalar(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = tmp_path / "run"
    with MetricsWriter(run, tensorboard=False, report_to=["mlflow"], project="exp",
                       config={"rl": {"lr": 1e-5}}) as w:  # fmt: skip
        for step in range(3):
            w.log(step, {"loss": 1.0 / (step + 1), "note": "text is not a scalar"}, prefix="rl")
        run_id = w._trackers[0].run_id  # type: ignore[union-attr]
    client = MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    hist = client.get_metric_history(run_id, "rl/loss")
    assert [(m.step, round(m.value, 6)) for m in hist] == [(0, 1.0), (1, 0.5), (2, 0.333333)]
    r = client.get_run(run_id)
    assert r.info.status == "FINISHED" and r.data.params["rl.lr"] == "1e-05"
    assert client.get_experiment(r.info.experiment_id).name == "exp"


def test_wandb_offline_run_is_written_and_finished(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    with MetricsWriter(run, tensorboard=False, report_to=["wandb"], name="t") as w:
        for step in range(3):
            w.log(step, {"loss": 2.0 - step}, prefix="sft")
    import wandb

    assert wandb.run is None  # finished by close()
    # finish() hands the records to wandb's service process, which writes them when it gets
    # to them; teardown() joins that process — wandb's own signal that every record is on
    # disk. Reading before it raced the writer on a busy machine (the file held its header).
    wandb.teardown()
    (offline,) = (run / "wandb").glob("offline-run-*")
    (records,) = offline.glob("run-*.wandb")  # what `wandb sync` uploads later
    data = records.read_bytes()
    assert b"sft/loss" in data  # the history records carry the metric


def test_a_missing_tracker_library_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb → ImportError
    with pytest.raises(ValueError, match=r"'wandb' is not installed .*provrl\[tracking\]"):
        MetricsWriter(tmp_path, tensorboard=False, report_to=["wandb"])
    with pytest.raises(ValueError, match="unknown tracker 'comet'"):
        MetricsWriter(tmp_path, tensorboard=False, report_to=["comet"])


def test_the_run_config_names_them(tmp_path):
    from provrl.config import load_config
    from provrl.run_config import RunConfig

    cfg = load_config(RunConfig, None, ["logging.report_to=[mlflow]", "logging.project=p"])
    w = MetricsWriter.from_logging(tmp_path / "r", cfg.logging)
    assert [type(t).__name__ for t in w._trackers] == ["MlflowTracker"]
    w.close()
