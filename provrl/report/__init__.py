"""Reporting: one metrics sink (JSONL + TensorBoard, and the trackers of
``logging.report_to``), plots, terminal rendering of trajectories, Parquet export.

``from provrl.report import MetricsWriter, read_metrics``. Names load on first use.
"""

from provrl._lazy import lazy_exports

_EXPORTS = {
    "MetricsWriter": "provrl.report.metrics",
    "read_metrics": "provrl.report.metrics",
    "plot_eval": "provrl.report.plots",
    "plot_sft_loss": "provrl.report.plots",
    "plot_panels": "provrl.report.plots",
    "show_trajectories": "provrl.report.show",
    "export_parquet": "provrl.report.export",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
