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


def test_reopening_a_torn_metrics_file_keeps_rows_on_their_own_lines(tmp_path):
    import pytest

    from provrl.trajlog import TornRecordWarning

    with MetricsWriter(tmp_path, tensorboard=False) as w:
        w.log(0, {"loss": 1.0})
    path = tmp_path / "metrics.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"step": 1, "lo')  # the process died mid-row
    with (
        pytest.warns(TornRecordWarning, match="moved to"),
        MetricsWriter(tmp_path, tensorboard=False) as w,
    ):
        w.log(2, {"loss": 0.5})
    assert [r["step"] for r in read_metrics(path)] == [0, 2]
    (side,) = tmp_path.glob("metrics.jsonl.torn-*")
    assert side.read_bytes() == b'{"step": 1, "lo'


def test_a_bad_metrics_row_in_the_middle_names_file_and_line(tmp_path):
    import pytest

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 0}\n{"step": 1, "lo{"step": 2}\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2: not a JSON metrics row"):
        read_metrics(path)
