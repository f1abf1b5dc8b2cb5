"""Pure tensor functions: advantages, IS corrections, policy losses, KL estimators, TRPO.

``from provrl.objectives import group_advantages, correct, policy_loss, trpo_step`` — see
docs/objectives.md (the corrections table) and docs/trpo.md. Names load on first use (they
import torch).
"""

from provrl._lazy import lazy_exports

_EXPORTS = {
    "AdvantageConfig": "provrl.objectives.config",
    "ObjectiveConfig": "provrl.objectives.config",
    "TRPOConfig": "provrl.objectives.config",
    "group_advantages": "provrl.objectives.advantages",
    "rloo_advantages": "provrl.objectives.advantages",
    "Correction": "provrl.objectives.corrections",
    "correct": "provrl.objectives.corrections",
    "log_ratio": "provrl.objectives.corrections",
    "sequence_log_weight": "provrl.objectives.corrections",
    "policy_loss": "provrl.objectives.losses",
    "clipped_surrogate": "provrl.objectives.losses",
    "aggregate": "provrl.objectives.losses",
    "LossOutput": "provrl.objectives.losses",
    "kl_estimate": "provrl.objectives.kl",
    "trpo_step": "provrl.objectives.trpo",
    "conjugate_gradient": "provrl.objectives.trpo",
    "fisher_vector_product": "provrl.objectives.trpo",
    "line_search": "provrl.objectives.trpo",
    "behaviour_kl": "provrl.objectives.diagnostics",
    "effective_sample_size": "provrl.objectives.diagnostics",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
