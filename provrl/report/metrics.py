"""One metrics sink for every room: JSONL (always) + TensorBoard event files (optional) +
Weights & Biases / MLflow runs (optional, ``report_to``, through their own libraries).

``metrics.jsonl`` has one object per ``log`` call: ``{"step": 3, "time": 12.5, "rl/loss": ...}``;
it is append-only and written a whole line at a time, so a crashed run keeps every logged
step. A writer reopening a file whose last line was torn (the process died mid-write) first
moves the torn bytes to ``metrics.jsonl.torn-<µs>`` — the rule of every append-only file of a
run, :mod:`provrl.appendlog` — so the next row starts on its own line instead of gluing onto
the fragment.

Trackers (``report_to``, the TRL name; ``logging.report_to`` in a run's config):

* ``tensorboard`` — event files in ``run_dir/tb`` (torch's SummaryWriter);
* ``wandb`` — a W&B run in ``run_dir/wandb``; ``WANDB_MODE=offline`` (or no login) keeps it
  on disk for ``wandb sync`` later;
* ``mlflow`` — an MLflow run (MlflowClient, no global state) at ``$MLFLOW_TRACKING_URI``,
  else a file store in ``run_dir/mlruns`` (``MLFLOW_ALLOW_FILE_STORE`` is set for it).

wandb and mlflow are extras (``pip install 'provrl[tracking]'``); asking for one that is not
installed is a one-line error naming it. Every scalar goes to each of them at the same step.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from provrl.appendlog import AppendLog, TornRecordWarning, read_lines

TRACKERS = ("tensorboard", "wandb", "mlflow")


class WandbTracker:
    """Scalars to a Weights & Biases run (``wandb.init`` in ``run_dir``)."""

    def __init__(self, run_dir: Path, project: str, name: str, config: Mapping[str, Any]) -> None:
        import wandb

        self.run = wandb.init(
            project=project, name=name, dir=str(run_dir), config=dict(config), reinit=True
        )

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """Scalars to an MLflow run, through ``MlflowClient`` (no process-global active run)."""

    def __init__(self, run_dir: Path, project: str, name: str, config: Mapping[str, Any]) -> None:
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # the local default: a file store (mlflow ≥ 3.7 asks for an opt-in)
            uri = (run_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(project)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(project)
        self.run_id = self.client.create_run(exp_id, run_name=name).info.run_id
        for key, value in _flat(config).items():
            self.client.log_param(self.run_id, key[:250], str(value)[:6000])

    def log(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        ms = int(time.time() * 1000)
        metrics = [Metric(k, v, ms, step) for k, v in scalars.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def open_tracker(
    kind: str, run_dir: Path, project: str, name: str, config: Mapping[str, Any]
) -> WandbTracker | MlflowTracker:
    """The ``wandb`` or ``mlflow`` tracker; a missing library is a one-line ValueError."""
    if kind not in ("wandb", "mlflow"):
        raise ValueError(f"logging.report_to: unknown tracker {kind!r} (known: {TRACKERS})")
    try:
        if kind == "wandb":
            return WandbTracker(run_dir, project, name, config)
        return MlflowTracker(run_dir, project, name, config)
    except ImportError as e:
        raise ValueError(
            f"logging.report_to: {kind!r} is not installed ({e.name}); "
            "pip install 'provrl[tracking]'"
        ) from None


class MetricsWriter:
    """Write scalar metrics (and histograms) under ``run_dir``, and to the trackers in
    ``report_to`` (see the module docstring).

    >>> w = MetricsWriter("runs/x", tensorboard=False)
    >>> w.log(0, {"loss": 1.0}, prefix="rl")
    >>> w.close()
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        tensorboard: bool = True,
        report_to: Sequence[str] = (),
        project: str = "provrl",
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        unknown = [k for k in report_to if k not in TRACKERS]
        if unknown:
            raise ValueError(f"logging.report_to: unknown tracker {unknown[0]!r} ({TRACKERS})")
        self._trackers = [
            open_tracker(k, self.run_dir, project, name or self.run_dir.name, config or {})
            for k in dict.fromkeys(report_to)
            if k != "tensorboard"
        ]
        self._log = AppendLog(self.path)  # a torn tail moved aside first
        self._t0 = time.time()
        self._tb: Any = None
        if tensorboard or "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tb"))

    @classmethod
    def from_logging(
        cls, run_dir: str | os.PathLike[str], logging: Any, config: Mapping[str, Any] | None = None
    ) -> MetricsWriter:
        """The writer a run's ``logging`` section asks for (``tensorboard``, ``report_to``,
        ``project``); ``config`` (e.g. the run's config dump) goes to the trackers."""
        return cls(
            run_dir,
            tensorboard=bool(getattr(logging, "tensorboard", True)),
            report_to=tuple(getattr(logging, "report_to", ())),
            project=str(getattr(logging, "project", "provrl")),
            config=config,
        )

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
        self._log.append(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        if self._trackers:
            scalars = {k: v for k, v in row.items() if k not in ("step", "time")}
            scalars = {k: v for k, v in scalars.items() if isinstance(v, float)}
            for tracker in self._trackers:
                tracker.log(int(step), scalars)

    def log_histogram(self, step: int, name: str, values: Any) -> None:
        if self._tb is not None:
            self._tb.add_histogram(name, np.asarray(values), step)

    def close(self) -> None:
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            tracker.close()
        self._log.close()
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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TornRecordWarning)
        for lineno, line in read_lines(path):
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON metrics row ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: a metrics row must be a JSON object")
            rows.append(row)
    return rows
