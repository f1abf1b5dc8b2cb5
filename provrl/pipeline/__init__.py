"""Orchestration, ``provrl run``: the stages, the strict on-policy (sync) and hot-load
(async) RL loop, admission control, the run's engine factory, the resumable run directory and
the run's report (docs/pipeline.md).

``from provrl.pipeline import run_pipeline, RLLoop`` — the settings are the ``pipeline``
section of the run config (:mod:`provrl.run_config.pipeline`). Names load on first use."""

from provrl._lazy import lazy_exports

_EXPORTS = {
    "run_pipeline": "provrl.pipeline.run",
    "RLLoop": "provrl.pipeline.rl_loop",
    "run_rl": "provrl.pipeline.rl_loop",
    "engine_factory": "provrl.pipeline.engines",
    "RunDir": "provrl.pipeline.rundir",
    "write_report": "provrl.pipeline.run_report",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
