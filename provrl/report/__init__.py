"""Metrics sink, plots and run reports."""

from provrl.report.metrics import MetricsWriter, read_metrics

__all__ = ["MetricsWriter", "read_metrics"]
