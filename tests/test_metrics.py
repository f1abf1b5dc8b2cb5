from __future__ import annotations

import math

from provrl.report import MetricsWriter, read_metrics


def test_metrics_jsonl_and_tensorboard(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=True) as w:
        w.log(0, {"loss": 1.5, "n": 3}, prefix="rl")
        w.log(1, {"loss": math.nan})
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows[0]["rl/loss"] == 1.5 and rows[0]["rl/n"] == 3.0 and rows[0]["step"] == 0
    assert rows[1]["loss"] is None
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
