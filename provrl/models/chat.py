"""Tokenizer helpers: chat-template ids (never text to be re-tokenized later) and the
tokenizer's identity (what a trajectory records, so another tokenizer's logs are refused)."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
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


_U, _A, _C = "PROVRLUSERTEXT", "PROVRLASSISTANTTEXT", "PROVRLNEWTURNTEXT"


@dataclass(frozen=True)
class TurnTemplate:
    """How a tokenizer's chat template writes the text between two assistant turns::

        … {assistant content}{close}{before}{observation}{after}     ← ``after`` opens the
                                                                         next assistant turn
    For ChatML (SmolLM2, Qwen): close = ``<|im_end|>\n``, before = ``<|im_start|>user\n``,
    after = ``<|im_end|>\n<|im_start|>assistant\n``; for Mistral: close = ``</s>``,
    before = ``[INST] ``, after = `` [/INST]``."""

    close: str
    before: str
    after: str


def _render(tokenizer: Any, messages: list[Message], generation: bool) -> str:
    return str(
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
    )


@functools.lru_cache(maxsize=64)
def turn_template(tokenizer: Any, role: str) -> TurnTemplate:
    """Read :class:`TurnTemplate` off the tokenizer's own chat template by rendering short
    conversations with placeholder contents and taking the differences. Tried two ways
    (templates differ in what they allow): a ``role`` turn after an assistant turn, else after
    the user turn (templates such as Qwen3's render an assistant turn differently once a
    later user turn exists). Raises ``ValueError`` naming the tokenizer when neither works."""
    name = getattr(tokenizer, "name_or_path", "?")
    try:
        with_answer = _render(tokenizer, [{"role": "user", "content": _U},
                                          {"role": "assistant", "content": _A}], False)  # fmt: skip
        close = with_answer[with_answer.index(_A) + len(_A) :]
        new = None
        for base_msgs in (
            [{"role": "user", "content": _U}, {"role": "assistant", "content": _A}],
            [{"role": "user", "content": _U}],
        ):
            base = _render(tokenizer, base_msgs, False)
            full = _render(tokenizer, [*base_msgs, {"role": role, "content": _C}], True)
            if full.startswith(base) and _C in full[len(base) :]:
                new = full[len(base) :]
                break
    except Exception as e:  # jinja raises its own errors (e.g. roles must alternate)
        raise ValueError(
            f"tokenizer {name!r}: its chat template cannot render a {role!r} turn after an "
            f"assistant turn ({type(e).__name__}: {e})"
        ) from e
    if new is None:
        raise ValueError(
            f"tokenizer {name!r}: cannot read the text between turns off its chat template "
            f"(rendering a {role!r} turn changes the earlier turns)"
        )
    before, _, after = new.partition(_C)
    return TurnTemplate(close, before, after)


def continuation_ids(
    tokenizer: Any, role: str, content: str, *, close_assistant: bool = True
) -> list[int]:
    """Ids that close the current assistant turn, add a ``role`` turn with ``content`` and
    open the next assistant turn — appended as non-action tokens between agent turns, with
    the text the tokenizer's own chat template writes there (:func:`turn_template`).

    ``close_assistant=False``: the turn already ended with a stop token (the model sampled
    ``<|im_end|>`` or ``</s>``); only what the template writes after that token is added
    (ChatML's ``\n``). Built by tokenizing only the new text, so earlier token ids are never
    re-tokenized."""
    tt = turn_template(tokenizer, role)
    turn = f"{tt.before}{content}{tt.after}"
    if close_assistant:
        return _encode(tokenizer, tt.close + turn)
    rest = tt.close
    for stop in stop_token_ids(tokenizer):
        text = tokenizer.convert_ids_to_tokens(stop)
        if isinstance(text, str) and text and rest.startswith(text):
            rest = rest[len(text) :]
            break
    return (_encode(tokenizer, rest) if rest else []) + _encode(tokenizer, turn)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]


def tokenizer_identity(tokenizer: Any) -> dict[str, str]:
    """``{"name": ..., "sha256": ...}``: the tokenizer's directory name and a hash of
    everything that maps text to ids and back — the vocabulary and merges (the serialised
    ``tokenizer.json``), the added and special tokens, and the chat template. Two
    tokenizers with equal hashes give the same ids for the same conversation."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:  # a slow (Python) tokenizer: its vocabulary
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    specials = {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())}
    h.update(json.dumps(specials, sort_keys=True).encode())
    h.update(str(getattr(tokenizer, "chat_template", "") or "").encode())
    name = Path(str(getattr(tokenizer, "name_or_path", "") or "unknown")).name
    return {"name": name, "sha256": "sha256:" + h.hexdigest()}
