"""The whole run's configuration: one typed section per room (presets in ``configs/``).

>>> from provrl.config import load_config
>>> cfg = load_config(RunConfig, "quick", ["rl.lr=1e-5"])

:class:`RunConfig` (:mod:`provrl.run_config.run`) composes the sections each room below it
defines in its own ``config.py`` (``engine``, ``env``, ``rl``/``sft``, ``ray``, ``theory``,
``classic``) with the sections of the rooms above it, which live here because those rooms
import the run config: ``pipeline`` (:mod:`provrl.run_config.pipeline`, ``provrl run``) and
``bench`` (:mod:`provrl.run_config.bench`, ``provrl bench …``). Names load on first use.
"""

from provrl._lazy import lazy_exports

_EXPORTS = {
    "RunConfig": "provrl.run_config.run",
    "ModelConfig": "provrl.run_config.run",
    "LoggingConfig": "provrl.run_config.run",
    "PipelineConfig": "provrl.run_config.pipeline",
    "RLLoopConfig": "provrl.run_config.pipeline",
    "BenchConfig": "provrl.run_config.bench",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
