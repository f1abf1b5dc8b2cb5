"""Models: load by name, tokenizer helpers (chat-template ids, identity), safetensors
checkpoints.

``from provrl.models import load_model, save_checkpoint, chat_ids`` — see docs/data.md. Names
load on first use (loading imports torch).
"""

from provrl._lazy import lazy_exports

_EXPORTS = {
    "chat_ids": "provrl.models.chat",
    "continuation_ids": "provrl.models.chat",
    "stop_token_ids": "provrl.models.chat",
    "tokenizer_identity": "provrl.models.chat",
    "CheckpointError": "provrl.models.checkpoint",
    "load_state_dict": "provrl.models.checkpoint",
    "save_checkpoint": "provrl.models.checkpoint",
    "MODELS": "provrl.models.loading",
    "LoadedModel": "provrl.models.loading",
    "load_model": "provrl.models.loading",
    "load_tokenizer": "provrl.models.loading",
    "policy_identity": "provrl.models.loading",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
