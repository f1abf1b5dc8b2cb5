"""Packed teacher forcing: a micro-batch of trajectories as one row — no padding, and every
prefix that several trajectories share (the system prompt of all of them, the question of
a GRPO group's k samples) computed once.

Layout. The rows of a micro-batch are laid out as a *prefix trie* (a radix tree over their
token ids): a node is a span of tokens that every row below it shares, and a row is the
path of nodes from a root to its leaf. A node shorter than ``min_shared`` tokens is not
shared (its tokens go into each child, so a trie never fragments into tiny spans). A row is
cut at L = its last action's index: a token after that is never a target, and the last
action itself is only a target (its hidden state is never used), so nothing the loss reads
is dropped. Positions: a node's tokens continue from the length of its ancestors, so every
row sees exactly its own positions 0…L−1.

Attention (:func:`packed_attention`, registered with transformers' ``AttentionInterface``
as ``provrl_packed``), for the tokens of node n with ancestors a₁ … a_m (root first)::

    n : all of a₁ … a_m, then causal within n          (never a sibling's tokens)

so every hidden state equals the one the padded per-trajectory forward computes, and
autograd accumulates the gradient of a shared node's keys and values from every row below
it. A GRPO group of k rows of length L sharing a prompt of length P costs
P + Σ_i (L_i − P) tokens instead of k · L. Without a layout (any other forward of the same
model) the function is transformers' SDPA attention unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

ATTENTION = "provrl_packed"
"""The attention implementation name a packed forward runs under."""

MIN_SHARED = 16
"""Shortest span shared as its own trie node (shorter common spans are repeated)."""


@dataclass(frozen=True)
class Node:
    """``[start, start + length)`` of the packed row; its ancestors' spans come first in
    attention (``ancestors``: node indices, root first)."""

    start: int
    length: int
    ancestors: tuple[int, ...]
    context: int
    """Tokens of the ancestors (the position of this node's first token)."""


@dataclass
class PackedLayout:
    """A micro-batch laid out as one row (see the module docstring)."""

    input_ids: torch.Tensor  # [1, N]
    position_ids: torch.Tensor  # [1, N]
    nodes: tuple[Node, ...]  # in packed order (a node after its ancestors)
    index: torch.Tensor  # [B, T] packed index of token (b, t); −1 where not laid out
    _masks: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def tokens(self) -> int:
        """N: tokens the forward computes."""
        return int(self.input_ids.shape[1])

    def node_mask(self, context: int, length: int, device: torch.device) -> torch.Tensor:
        """``[length, context + length]`` bool: a node's token attends to every ancestor
        token and causally to its own node (cached per shape)."""
        key = (context, length)
        if key not in self._masks:
            m = torch.ones(length, context + length, dtype=torch.bool, device=device)
            self._masks[key] = m.tril(context)
        return self._masks[key]


def common_prefix(rows: Sequence[np.ndarray], cap: int) -> int:
    """Length of the longest common prefix of ``rows`` (at most ``cap``; 0 for one row)."""
    if len(rows) < 2:
        return 0
    n = min(cap, *(len(r) for r in rows))
    if n <= 0:
        return 0
    stack = np.stack([r[:n] for r in rows])
    diff = np.flatnonzero(~(stack == stack[0]).all(axis=0))
    return int(diff[0]) if len(diff) else n


def build_trie(
    seqs: Sequence[np.ndarray], min_shared: int = MIN_SHARED
) -> list[tuple[int, int, int, list[int]]]:
    """Radix-tree nodes over ``seqs`` as ``(parent, offset, length, members)`` in DFS order
    (a parent before its children; parent −1 for a root); ``members`` are the sequences
    that pass through the node. Every sequence ends in exactly one node, whose
    ``offset + length`` is its length."""
    nodes: list[tuple[int, int, int, list[int]]] = []

    def grow(members: list[int], parent: int, offset: int) -> None:
        if len(members) == 1:
            (r,) = members
            if len(seqs[r]) > offset:
                nodes.append((parent, offset, len(seqs[r]) - offset, members))
            return
        rest = [r for r in members if len(seqs[r]) > offset]  # the others end at offset
        lcp = common_prefix([seqs[r][offset:] for r in rest], 1 << 62) if len(rest) > 1 else 0
        if len(rest) > 1 and lcp >= min_shared:
            nodes.append((parent, offset, lcp, rest))
            grow(rest, len(nodes) - 1, offset + lcp)
            return
        if len(rest) == 1:
            grow(rest, parent, offset)
            return
        # split by the token where the members first differ; each part is grown from
        # ``offset`` again, so a part's own (longer) common prefix can be shared
        by_token: dict[int, list[int]] = {}
        for r in rest:
            by_token.setdefault(int(seqs[r][offset + lcp]) if len(seqs[r]) > offset + lcp else -1, []).append(r)  # fmt: skip
        if len(by_token) == 1:  # no split possible below min_shared: every member alone
            for r in rest:
                grow([r], parent, offset)
            return
        for part in by_token.values():
            grow(part, parent, offset)

    grow(list(range(len(seqs))), -1, 0)
    return nodes


def pack(
    input_ids: torch.Tensor,
    lengths: torch.Tensor,
    action_mask: torch.Tensor,
    rows: Sequence[int],
    *,
    share_prefix: bool = True,
    min_shared: int = MIN_SHARED,
) -> PackedLayout:
    """Lay out ``rows`` of a right-padded batch (``input_ids [B, T]``, ``lengths [B]``,
    ``action_mask [B, T]``) as a prefix trie (each row alone when ``share_prefix`` is
    False). A row without action tokens has nothing to teacher-force and is left out."""
    B, T = input_ids.shape
    ids_np = input_ids.cpu().numpy()
    act_np = action_mask.cpu().numpy()
    kept, seqs = [], []
    for r in rows:
        acts = np.flatnonzero(act_np[r, : int(lengths[r])])
        if len(acts):  # inputs 0 … last action − 1 predict every action
            kept.append(r)
            seqs.append(ids_np[r, : int(acts[-1])])
    if not kept:
        raise ValueError("pack: none of the rows has an action token")
    raw = (
        build_trie(seqs, min_shared)
        if share_prefix
        else [(-1, 0, len(s), [i]) for i, s in enumerate(seqs) if len(s)]
    )
    index = torch.full((B, T), -1, dtype=torch.long)
    nodes: list[Node] = []
    ids_parts, pos_parts = [], []
    start = 0
    for parent, offset, length, members in raw:
        ancestors = (*nodes[parent].ancestors, parent) if parent >= 0 else ()
        nodes.append(Node(start, length, ancestors, offset))
        ids_parts.append(seqs[members[0]][offset : offset + length])
        pos_parts.append(np.arange(offset, offset + length))
        span = torch.arange(start, start + length)
        for m in members:
            index[kept[m], offset : offset + length] = span
        start += length
    dev = input_ids.device
    return PackedLayout(
        input_ids=torch.from_numpy(np.concatenate(ids_parts)).long()[None].to(dev),
        position_ids=torch.from_numpy(np.concatenate(pos_parts)).long()[None].to(dev),
        nodes=tuple(nodes),
        index=index.to(dev),
    )


# ------------------------------------------------------------------------------ attention
def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query [1, H, N, D]``, ``key`` /
    ``value`` ``[1, H_kv, N, D]`` → ``[1, N, H, D]``. With ``provrl_layout`` in the kwargs,
    the trie attention of the module docstring; otherwise SDPA as transformers runs it."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layout: PackedLayout | None = kwargs.pop("provrl_layout", None)
    if layout is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    sdpa = torch.nn.functional.scaled_dot_product_attention
    gqa = getattr(module, "num_key_value_groups", 1) > 1
    context: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # node -> (K, V) of its path
    pieces = []
    for i, n in enumerate(layout.nodes):
        sl = slice(n.start, n.start + n.length)
        q, k, v = query[:, :, sl], key[:, :, sl], value[:, :, sl]
        if n.ancestors:
            pk, pv = context[n.ancestors[-1]]
            k, v = torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2)
            m = layout.node_mask(n.context, n.length, query.device)
            pieces.append(sdpa(q, k, v, attn_mask=m, scale=scaling, enable_gqa=gqa))
        else:
            pieces.append(sdpa(q, k, v, is_causal=True, scale=scaling, enable_gqa=gqa))
        context[i] = (k, v)
    out = torch.cat(pieces, dim=2)
    return out.transpose(1, 2).contiguous(), None


_REGISTERED = False


def register() -> None:
    """Register :func:`packed_attention` (and SDPA's mask builder) under :data:`ATTENTION`."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTENTION, packed_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)
    _REGISTERED = True


def use_packed_attention(model: Any) -> None:
    """Switch ``model`` (an HF causal LM) to :data:`ATTENTION`: SDPA for every ordinary
    forward, the prefix-tree attention when a layout is passed (:func:`packed_hidden`)."""
    register()
    model.config._attn_implementation = ATTENTION


_LAYOUT_MASK = torch.ones(1, 1, 1, 1, dtype=torch.bool)
"""A 4-D mask tells transformers the mask is prepared (no mask is built); the layout's
attention ignores it."""


def packed_hidden(model: Any, layout: PackedLayout) -> torch.Tensor:
    """Final hidden states ``[N, H]`` of the packed row (``model`` switched with
    :func:`use_packed_attention`)."""
    if model.config._attn_implementation != ATTENTION:
        raise ValueError(
            f"packed forward needs attention {ATTENTION!r} (use_packed_attention(model)), "
            f"the model runs {model.config._attn_implementation!r}"
        )
    out = model.base_model(
        input_ids=layout.input_ids,
        position_ids=layout.position_ids,
        attention_mask=_LAYOUT_MASK,
        use_cache=False,
        provrl_layout=layout,
    )
    return out.last_hidden_state[0]


# ------------------------------------------------------------------------------ micro-batches
def cut_rows(
    input_ids: torch.Tensor, lengths: torch.Tensor, action_mask: torch.Tensor
) -> list[np.ndarray]:
    """Each row's ids as a layout holds them: up to its last action (empty without one)."""
    ids = input_ids.cpu().numpy()
    act = action_mask.cpu().numpy()
    out = []
    for r, n in enumerate(lengths.tolist()):
        a = np.flatnonzero(act[r, :n])
        out.append(ids[r, : a[-1]] if len(a) else ids[r, :0])
    return out


def plan_micro_batches(
    rows: Sequence[int],
    seqs: Sequence[np.ndarray],
    budget: int,
    *,
    share_prefix: bool = True,
    min_shared: int = MIN_SHARED,
) -> list[list[int]]:
    """Split ``rows`` into micro-batches of at most ``budget`` packed tokens (a row longer
    than the budget runs alone; rows with empty ``seqs`` — no actions — are left out).
    Rows go in lexicographic order of their ids, so rows that share a prefix are adjacent;
    a row then adds ``len − LCP(row, previous row)`` tokens to its micro-batch's trie (the
    LCP counted only from ``min_shared`` and with ``share_prefix``), which is exactly what
    the trie of :func:`pack` grows by. Each micro-batch is returned in ascending rows."""
    order = sorted((r for r in rows if len(seqs[r])), key=lambda r: tuple(seqs[r].tolist()))
    out: list[list[int]] = []
    current: list[int] = []
    cost = 0
    for r in order:
        shared = 0
        if current and share_prefix:
            shared = common_prefix([seqs[current[-1]], seqs[r]], len(seqs[r]))
            shared = shared if shared >= min_shared else 0
        extra = len(seqs[r]) - shared
        if current and cost + extra > budget:
            out.append(sorted(current))
            current, cost, extra = [], 0, len(seqs[r])
        current.append(r)
        cost += extra
    if current:
        out.append(sorted(current))
    return out
