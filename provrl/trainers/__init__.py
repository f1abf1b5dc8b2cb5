"""TRL's front doors onto provrl: :class:`GRPOTrainer` / :class:`GRPOConfig` run the whole
``provrl run`` pipeline (probe, async RL with per-token provenance, report) on your QA data,
reward functions and search tool; :class:`SFTTrainer` / :class:`SFTConfig` fine-tune on
conversations or trajectories. Names load on first use."""

from provrl._lazy import lazy_exports

_EXPORTS = {
    "GRPOTrainer": "provrl.trainers.grpo",
    "GRPOConfig": "provrl.trainers.grpo",
    "SFTTrainer": "provrl.trainers.sft",
    "SFTConfig": "provrl.trainers.sft",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
