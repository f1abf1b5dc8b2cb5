"""One metrics sink for every room: JSONL (always) + TensorBoard event files (optional).

``metrics.jsonl`` has one object per ``log`` call: ``{"step": 3, "time": 12.5, "rl/loss": ...}``;
it is append-only and flushed per line, so a crashed run keeps every logged step. A writer
reopening a file whose last line was torn (the process died mid-write) first moves the torn
bytes to ``metrics.jsonl.torn-<µs>`` (as the trajectory log does), so the next row starts on
its own line instead of gluing onto the fragment.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from provrl.trajlog import repair_torn_tail


class MetricsWriter:
    """Write scalar metrics (and histograms) under ``run_dir``.

    >>> w = MetricsWriter("runs/x", tensorboard=False)
    >>> w.log(0, {"loss": 1.0}, prefix="rl")
    >>> w.close()
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, tensorboard: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        repair_torn_tail(self.path)
        self._f = open(self.path, "ab")  # noqa: SIM115 - closed in close()
        self._t0 = time.time()
        self._tb: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tb"))

    def log(self, step: int, metrics: Mapping[str, Any], prefix: str = "") -> None:
        """Log scalars at ``step``. Non-finite values are kept in JSONL as null."""
        row: dict[str, Any] = {"step": int(step), "time": round(time.time() - self._t0, 4)}
        for key, value in metrics.items():
            name = f"{prefix}/{key}" if prefix else key
            v = float(value) if isinstance(value, int | float | np.number) else value
            if isinstance(v, float) and not math.isfinite(v):
                row[name] = None
                continue
            row[name] = v
            if self._tb is not None and isinstance(v, float):
                self._tb.add_scalar(name, v, step)
        self._f.write(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        self._f.flush()

    def log_histogram(self, step: int, name: str, values: Any) -> None:
        if self._tb is not None:
            self._tb.add_histogram(name, np.asarray(values), step)

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All rows of a ``metrics.jsonl`` (a torn last line is ignored). A bad line in the
    middle raises ``ValueError`` naming the file and line."""
    rows = []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                break
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON metrics row ({e})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: a metrics row must be a JSON object")
            rows.append(row)
    return rows
