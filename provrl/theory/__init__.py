"""Exact TRPO quantities on tabular MDPs and mixed-version importance sampling
(docs/theory.md).

``from provrl.theory import random_mdp, compare, check_bounds`` — ``provrl theory …`` is the
command. Names load on first use."""

from provrl._lazy import lazy_exports

_EXPORTS = {
    "TabularMDP": "provrl.theory.mdp",
    "random_mdp": "provrl.theory.mdp",
    "chain_mdp": "provrl.theory.mdp",
    "gridworld_mdp": "provrl.theory.mdp",
    "evaluate": "provrl.theory.exact",
    "compare": "provrl.theory.exact",
    "check_bounds": "provrl.theory.bound_check",
    "mm_report": "provrl.theory.mm",
    "mixed_version_report": "provrl.theory.mixed",
    "filtering_report": "provrl.theory.filtering",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
