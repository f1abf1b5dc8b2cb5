"""Chat JSONL for SFT: ``{"messages": [{"role": ..., "content": ...}, ...]}`` per line (the
format of TRL's ``SFTTrainer`` conversational datasets), as trajectories whose action tokens
are the assistant turns.

Each conversation is tokenized with the model's own chat template the way the agent loop
builds a multi-turn episode — context, then an assistant turn, then more context::

    for each assistant message k:
        P_k = chat_ids(messages[:k], add_generation_prompt=True)    prompt up to turn k
        F_k = chat_ids(messages[:k+1])                              … and turn k itself
        context tokens  = P_k[len(F_{k-1}):]                        non-action
        action tokens   = F_k[len(P_k):] up to the turn's stop token  (loss on these)
        template tokens = what the template writes after the stop token  non-action

so the loss is L = −(1/N) Σ_{t ∈ assistant turns} log π_θ(x_t | x_<t), the same action-token
NLL as on agent traces (:mod:`provrl.train.sft`), and the model learns to end its turns. A
template that re-renders earlier turns when a later one is added (so F_{k-1} is not a prefix
of P_k) is refused with the line number: its ids would not be what generation sees.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from provrl.env.jsonl import iter_records
from provrl.models.chat import chat_ids, stop_token_ids, tokenizer_identity
from provrl.provenance import Identity, ProvenanceError, SamplingParams, Trajectory
from provrl.provenance import TrajectoryBuilder as Builder

ROLES = ("system", "user", "assistant", "tool")


class ChatDataError(ValueError):
    """A chat JSONL file is malformed; the message names the file, the line and the field."""


def check_messages(d: Any, where: str) -> list[dict[str, str]]:
    """The ``messages`` of one record, validated: a list of ``{role, content}`` objects
    with known roles and string contents, at least one assistant turn."""
    if not isinstance(d, dict) or "messages" not in d:
        raise ChatDataError(f"{where}: expected an object with field 'messages'")
    msgs = d["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise ChatDataError(f"{where}: field 'messages' must be a non-empty list")
    out = []
    for j, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise ChatDataError(f"{where}: field 'messages[{j}].content' must be a string")
        if m.get("role") not in ROLES:
            raise ChatDataError(
                f"{where}: field 'messages[{j}].role' is {m.get('role')!r}, expected one of "
                f"{', '.join(ROLES)}"
            )
        out.append({"role": m["role"], "content": m["content"]})
    if not any(m["role"] == "assistant" for m in out):
        raise ChatDataError(f"{where}: no assistant message — nothing to learn")
    if out[0]["role"] == "assistant":
        raise ChatDataError(f"{where}: field 'messages[0]' is an assistant turn with no context")
    return out


def chat_trajectory(
    tokenizer: Any, messages: list[dict[str, str]], traj_id: str, policy: Identity
) -> Trajectory:
    """One conversation as a trajectory (see the module docstring): assistant turns are
    actions of a deterministic teacher (logprob 0, version 0), the rest context."""
    stops = set(stop_token_ids(tokenizer))
    b = Builder(traj_id, traj_id)
    done: list[int] = []
    turn = 0
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = chat_ids(tokenizer, messages[:k], add_generation_prompt=True)
        full = chat_ids(tokenizer, messages[: k + 1], add_generation_prompt=False)
        if prompt[: len(done)] != done or full[: len(prompt)] != prompt:
            raise ProvenanceError(
                f"messages[{k}]: the chat template re-renders earlier turns when this one is "
                "added, so the ids differ from what generation would see"
            )
        if turn:
            b.next_turn()
        context = prompt[len(done) :]
        if context:
            (b.add_prompt if not done else b.add_observation)(context)
        span = full[len(prompt) :]
        ends = [i for i, t in enumerate(span) if t in stops]
        n_act = ends[-1] + 1 if ends else len(span)
        if n_act == 0:
            raise ProvenanceError(f"messages[{k}]: the assistant turn renders to no tokens")
        b.add_actions(span[:n_act], logprob=[0.0] * n_act, kept_mass=[1.0] * n_act,
                      version=0, kv_min=0, kv_max=0, replica=0)  # fmt: skip
        if span[n_act:]:
            b.add_template(span[n_act:])
        done = full
        turn += 1
    return b.build(
        reward=1.0,
        sampling=SamplingParams(temperature=0.0),
        policy=policy,
        meta={"source": "chat", "messages": len(messages)},
    )


def load_chat_jsonl(path: str | os.PathLike[str], tokenizer: Any) -> list[Trajectory]:
    """Every conversation of a chat JSONL file as a trajectory tokenized by ``tokenizer``
    (blank lines skipped; ``id`` names a record, else ``<file stem>:<line>``). Errors name
    the file and line."""
    p = Path(path)
    h = hashlib.sha256(p.read_bytes() if p.is_file() else b"").hexdigest()
    policy = Identity(
        "chat-data", f"sha256:{h}", {"file": str(p), "tokenizer": tokenizer_identity(tokenizer)}
    )
    out = []
    for lineno, d in iter_records(p, ChatDataError, "chat file"):
        where = f"{p}:{lineno}"
        messages = check_messages(d, where)
        rid = d.get("id", f"{p.stem}:{lineno}")
        try:
            out.append(chat_trajectory(tokenizer, messages, str(rid), policy))
        except (ProvenanceError, ValueError) as e:
            raise ChatDataError(f"{where}: {e}") from None
    if not out:
        raise ChatDataError(f"{p}: no conversations (the file is empty)")
    return out
