"""Classic control (gymnasium) with the same TRPO step as the LLM trainer (docs/trpo.md).

``from provrl.classic import train, config_for`` — ``provrl trpo --env CartPole-v1`` is the
command. Names load on first use (they import torch and gymnasium)."""

from provrl._lazy import lazy_exports

_EXPORTS = {
    "ClassicTRPOConfig": "provrl.classic.config",
    "config_for": "provrl.classic.config",
    "TrainResult": "provrl.classic.train",
    "train": "provrl.classic.train",
    "evaluate": "provrl.classic.train",
    "save_agent": "provrl.classic.train",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
