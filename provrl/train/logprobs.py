"""Teacher-forced log-probabilities of given token ids under a causal LM.

This is the trainer's view of π_θ(a_t | h_t); the engine's recorded behaviour logprobs
must match it exactly when no weights changed and sampling is untruncated at T = 1.
"""

from __future__ import annotations

from typing import Any

import torch


def token_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
) -> torch.Tensor:
    """``out[b, t] = log softmax(logits[b, t-1] / temperature)[input_ids[b, t]]``; ``out[:, 0] = 0``.

    ``input_ids`` is ``[B, T]`` right-padded; ``attention_mask`` marks real tokens. Returns
    float32 ``[B, T]`` (differentiable if the model is in a grad context).
    """
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
    logits = model(input_ids=input_ids, attention_mask=attention_mask.long()).logits
    logits = logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    picked = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0), value=0.0)
