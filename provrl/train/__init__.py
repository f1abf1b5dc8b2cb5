"""Trainers (RL on LLM policies; SFT) sharing the model forward with the engine.

``from provrl.train import RLTrainer, RLConfig, run_sft, SFTConfig`` — see docs/objectives.md
and docs/sft.md. Names load on first use (they import torch).
"""

from provrl._lazy import lazy_exports

_EXPORTS = {
    "RLConfig": "provrl.train.config",
    "SFTConfig": "provrl.train.config",
    "RLTrainer": "provrl.train.rl",
    "StepResult": "provrl.train.rl",
    "prepare_batch": "provrl.train.rl",
    "run_sft": "provrl.train.sft",
    "train_sft": "provrl.train.sft",
    "load_traces": "provrl.train.sft",
    "select_traces": "provrl.train.sft",
    "load_chat_jsonl": "provrl.train.chat_data",
    "token_logprobs": "provrl.train.logprobs",
    "token_logprobs_chunked": "provrl.train.logprobs",
    "lr_at": "provrl.train.schedule",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
