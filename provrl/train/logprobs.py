"""Teacher-forced log-probabilities of given token ids under a causal LM.

This is the trainer's view of π_θ(a_t | h_t); the engine's recorded behaviour logprobs
must match it exactly when no weights changed and sampling is untruncated at T = 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from provrl.provenance import ProvenanceError, Trajectory
from provrl.train.packing import PackedLayout, packed_hidden


def check_teacher_forced(traj: Trajectory, vocab_size: int | None = None) -> None:
    """A trajectory whose action logprobs a teacher-forced pass can compute: valid
    provenance, no action at position 0 (it has no context), token ids inside the
    vocabulary (when ``vocab_size`` is given). Raises :class:`ProvenanceError` naming it."""
    traj.validate()
    where = f"trajectory {traj.traj_id!r} (task {traj.task_id!r})"
    if len(traj) and bool(traj.is_action[0]):
        raise ProvenanceError(f"{where}: token 0 is an action but has no context")
    if vocab_size is not None and len(traj) and int(traj.token_id.max()) >= vocab_size:
        i = int(np.flatnonzero(traj.token_id >= vocab_size)[0])
        raise ProvenanceError(f"{where}: token {i}: id {traj.token_id[i]} ≥ vocab {vocab_size}")


def check_tokenizer(traj: Trajectory, expected: dict[str, str] | None, source: str = "") -> None:
    """Refuse a trajectory tokenized by another tokenizer than ``expected`` (the
    ``{"name", "sha256"}`` of :func:`provrl.models.tokenizer_identity`): its token ids
    would be trained on as other text. The trajectory's tokenizer is the one its policy
    identity records; a trajectory that records none (written before tokenizers were
    recorded) passes. Raises :class:`ProvenanceError` naming ``source`` and both names."""
    got = traj.policy.config.get("tokenizer") if isinstance(traj.policy.config, dict) else None
    if expected is None or not isinstance(got, dict) or "sha256" not in got:
        return
    if got["sha256"] != expected["sha256"]:
        where = f"{source}: " if source else ""
        raise ProvenanceError(
            f"{where}trajectory {traj.traj_id!r} was tokenized by {got.get('name', '?')!r} "
            f"({str(got['sha256'])[7:19]}…), the model's tokenizer is {expected['name']!r} "
            f"({expected['sha256'][7:19]}…): its ids would be read as other text — "
            f"re-generate the traces with this model's tokenizer"
        )


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


# --------------------------------------------------------------------------- chunked version
@dataclass
class TokenStats:
    """Teacher-forced per-token quantities at the requested positions (0 elsewhere)."""

    logprobs: torch.Tensor
    """``[B, T]`` log π_θ(x_t | x_<t) (differentiable when computed with grad)."""
    entropy: torch.Tensor | None = None
    """``[B, T]`` entropy H(π_θ(· | x_<t)) in nats (detached), when requested."""
    excluded_mass: torch.Tensor | None = None
    """``[B, T]`` π_θ mass a top-k/top-p sampler would exclude (detached), when requested
    (see :func:`provrl.objectives.diagnostics.support_excluded_mass`)."""
    log_softmax: torch.Tensor | None = None
    """``[N, V]`` full log π_θ(· | x_<t) (detached) at the N requested positions, in
    ``positions.nonzero()`` order, when requested. Memory N · V floats."""


def head_logits(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """Logits (float32) from final hidden states, as the causal-LM head computes them:
    ``lm_head(h)``, soft-capped when the config says so (Gemma 2)."""
    logits = model.get_output_embeddings()(hidden).float()
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = cap * torch.tanh(logits / cap)
    return logits


def hidden_before(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Final hidden states that predict the tokens at ``positions``: ``h[i] = hidden[b, t−1]``
    for the i-th (b, t) of ``positions.nonzero()``. Returns ``(h [N, H], rows, cols)``."""
    hidden = model.base_model(
        input_ids=input_ids, attention_mask=attention_mask.long(), use_cache=False
    ).last_hidden_state
    rows, cols = positions.nonzero(as_tuple=True)
    return hidden[rows, cols - 1], rows, cols


def _picked_logprobs(z: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(z)[y] = z_y − logsumexp(z), row by row of ``z [N, V]``."""
    return z.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(z, dim=-1)


def _chunk_logprobs(
    model: Any, hidden: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor
) -> torch.Tensor:
    """log softmax(head(h)/τ)[y] for one chunk of positions ``[N, H]``."""
    return _picked_logprobs(head_logits(model, hidden) / temperature[:, None], targets)


def entropy_from_logits(z: torch.Tensor) -> torch.Tensor:
    """H(softmax(z)) = −Σ_v p_v log p_v per row of ``z [N, V]``, in nats (differentiable)."""
    logp = torch.log_softmax(z, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def _chunk_logprobs_entropy(
    model: Any, hidden: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log softmax(z)[y], H(softmax(z))) with z = head(h)/τ for one chunk, both with grad."""
    z = head_logits(model, hidden) / temperature[:, None]
    return _picked_logprobs(z, targets), entropy_from_logits(z)


def token_logprobs_chunked(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    positions: torch.Tensor | None = None,
    temperature: torch.Tensor | float = 1.0,
    chunk_tokens: int = 1024,
    with_entropy: bool = False,
    top_p: torch.Tensor | float | None = None,
    top_k: torch.Tensor | int | None = None,
    with_log_softmax: bool = False,
    entropy_grad: bool = False,
    layout: PackedLayout | None = None,
) -> TokenStats:
    """Same values as :func:`token_logprobs`, without ever materialising ``[B, T, V]``.

    The decoder runs once to give final hidden states h ``[B, T, H]``; the LM head and the
    log-softmax then run on chunks of ``chunk_tokens`` positions, and only at
    ``positions`` (a ``[B, T]`` bool mask, default every real token after the first —
    pass the action mask to skip prompt and tool tokens entirely):

    .. math:: \\log\\pi_\\theta(x_t|x_{<t}) = z_{t-1}[x_t] - \\log\\textstyle\\sum_v e^{z_{t-1}[v]},
              \\quad z_{t-1} = W_{head}\\, h_{t-1} / \\tau

    With ``layout`` (:func:`provrl.train.packing.pack` of these rows) the decoder runs on
    the packed row instead — no padding, each group's shared prefix once — and h_{t−1} is
    read from it (:func:`provrl.train.packing.packed_hidden`); rows the layout does not
    hold get 0. The values are the same.

    With grad enabled each chunk is activation-checkpointed, so backward recomputes its
    logits instead of storing them: peak memory is O(chunk_tokens · V), not O(B·T·V).
    ``temperature`` may be a per-row ``[B]`` tensor. ``top_p``/``top_k`` (per row or scalar)
    turn on ``excluded_mass``; ``with_entropy`` turns on ``entropy``; ``with_log_softmax``
    turns on ``log_softmax`` (all three detached). Without grad each chunk's logits are
    computed once and serve every requested quantity. ``entropy_grad`` computes ``entropy``
    with grad instead (an entropy bonus in the loss), checkpointed like the logprobs.

    Supports causal LMs whose logits are ``lm_head(decoder(x))`` (optionally soft-capped):
    Llama, Qwen, Mistral, Gemma, SmolLM, …
    """
    B = input_ids.shape[0]
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
    attention_mask = attention_mask.bool()
    if positions is None:
        positions = attention_mask.clone()
        positions[:, 0] = False
    positions = positions.bool() & attention_mask
    if bool(positions[:, 0].any()):
        raise ValueError("position 0 has no context: its logprob is undefined")
    temp = torch.as_tensor(temperature, dtype=torch.float32, device=input_ids.device)
    temp = temp.expand(B) if temp.ndim == 0 else temp
    if temp.shape != (B,) or bool((temp <= 0).any()):
        raise ValueError(f"temperature must be > 0, scalar or one per row ({B}), got {temp}")

    if layout is None:
        h, rows, cols = hidden_before(model, input_ids, attention_mask, positions)
    else:
        positions = positions & (layout.index >= 0).roll(1, dims=1)
        rows, cols = positions.nonzero(as_tuple=True)
        h = packed_hidden(model, layout)[layout.index[rows, cols - 1]]
    return head_stats(
        model,
        h,
        rows,
        cols,
        input_ids,
        temp,
        chunk_tokens=chunk_tokens,
        with_entropy=with_entropy,
        top_p=top_p,
        top_k=top_k,
        with_log_softmax=with_log_softmax,
        entropy_grad=entropy_grad,
    )


def head_stats(
    model: Any,
    h: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    input_ids: torch.Tensor,
    temp: torch.Tensor,
    *,
    chunk_tokens: int = 1024,
    with_entropy: bool = False,
    top_p: torch.Tensor | float | None = None,
    top_k: torch.Tensor | int | None = None,
    with_log_softmax: bool = False,
    entropy_grad: bool = False,
) -> TokenStats:
    """The LM-head half of :func:`token_logprobs_chunked`: ``h [N, H]`` are the hidden
    states that predict tokens ``input_ids[rows, cols]``; ``temp [B]`` the rows'
    temperatures. Returns the ``[B, T]`` statistics (0 off the N positions)."""
    from torch.utils.checkpoint import checkpoint

    from provrl.objectives.diagnostics import support_excluded_mass

    B, T = input_ids.shape
    y = input_ids[rows, cols]
    t_rows = temp[rows]
    want_support = top_p is not None or top_k is not None
    if want_support:
        dev = input_ids.device
        tp = torch.as_tensor(1.0 if top_p is None else top_p, dtype=torch.float64, device=dev)
        tk = torch.as_tensor(0 if top_k is None else top_k, dtype=torch.int64, device=dev)
        tp_rows = tp.expand(B)[rows] if tp.ndim <= 1 else tp[rows, cols]
        tk_rows = tk.expand(B)[rows] if tk.ndim <= 1 else tk[rows, cols]

    grad_entropy = entropy_grad and torch.is_grad_enabled()
    with_entropy = with_entropy or entropy_grad
    detached_entropy = with_entropy and not grad_entropy
    want_stats = detached_entropy or want_support or with_log_softmax
    pieces, ent, exc, full = [], [], [], []
    if with_log_softmax and h.shape[0] == 0:  # no positions: an empty [0, V]
        full.append(head_logits(model, h.detach()))
    for s in range(0, h.shape[0], chunk_tokens):
        sl = slice(s, s + chunk_tokens)
        if torch.is_grad_enabled():
            if grad_entropy:
                lp, e = checkpoint(
                    _chunk_logprobs_entropy, model, h[sl], y[sl], t_rows[sl], use_reentrant=False
                )
                ent.append(e)
            else:
                lp = checkpoint(
                    _chunk_logprobs, model, h[sl], y[sl], t_rows[sl], use_reentrant=False
                )
            pieces.append(lp)
            if not want_stats:
                continue
            with torch.no_grad():
                z = head_logits(model, h[sl].detach()) / t_rows[sl, None]
        else:
            z = head_logits(model, h[sl]) / t_rows[sl, None]
            pieces.append(_picked_logprobs(z, y[sl]))
        with torch.no_grad():
            if detached_entropy or with_log_softmax:
                logp_all = torch.log_softmax(z, dim=-1)
                if detached_entropy:
                    ent.append(-(logp_all.exp() * logp_all).sum(-1))
                if with_log_softmax:
                    full.append(logp_all)
            if want_support:
                exc.append(support_excluded_mass(z, tp_rows[sl], tk_rows[sl]).float())

    def scatter(values: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.cat(values) if values else h.new_zeros(0, dtype=torch.float32)
        out = torch.zeros(B, T, dtype=flat.dtype, device=flat.device)
        return out.index_put((rows, cols), flat)

    return TokenStats(
        logprobs=scatter(pieces),
        entropy=scatter(ent) if with_entropy else None,
        excluded_mass=scatter(exc) if want_support else None,
        log_softmax=torch.cat(full) if full else None,
    )
