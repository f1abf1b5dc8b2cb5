"""Chat-template helpers that return token ids (never text to be re-tokenized later)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Message = dict[str, str]


def chat_ids(
    tokenizer: Any, messages: Sequence[Message], add_generation_prompt: bool = True
) -> list[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template."""
    out = tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=add_generation_prompt, tokenize=True
    )
    if hasattr(out, "keys"):  # transformers ≥ 5 returns a BatchEncoding
        out = out["input_ids"]
    return [int(i) for i in out]


def stop_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """Ids that end an assistant turn (EOS and, for ChatML templates, ``<|im_end|>``)."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return tuple(sorted(ids))


def continuation_ids(
    tokenizer: Any, role: str, content: str, *, close_assistant: bool = True
) -> list[int]:
    """Ids that close the current assistant turn, add a ``role`` turn with ``content`` and
    open the next assistant turn — appended as non-action tokens between agent turns.

    For ChatML (SmolLM2, Qwen): ``<|im_end|>\\n<|im_start|>{role}\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n``. Built by tokenizing only the new text, so earlier token ids
    are never re-tokenized."""
    text = ("<|im_end|>\n" if close_assistant else "") + (
        f"<|im_start|>{role}\n{content}<|im_end|>\n<|im_start|>assistant\n"
    )
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
