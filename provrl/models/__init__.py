"""Models: load by name, chat-template ids, safetensors checkpoints."""

from provrl.models.chat import chat_ids, continuation_ids, stop_token_ids
from provrl.models.checkpoint import CheckpointError, load_state_dict, save_checkpoint
from provrl.models.loading import (
    MODELS,
    LoadedModel,
    load_model,
    load_tokenizer,
    policy_identity,
    tokenizer_identity,
)

__all__ = [
    "MODELS",
    "CheckpointError",
    "LoadedModel",
    "chat_ids",
    "continuation_ids",
    "load_model",
    "load_state_dict",
    "load_tokenizer",
    "policy_identity",
    "save_checkpoint",
    "stop_token_ids",
    "tokenizer_identity",
]
