r"""A slim Llama-family forward (Llama, Mistral, Qwen2/2.5, Qwen3) for batched decode +
chunked prefill over a slotted KV cache.

The maths is HF's ``LlamaForCausalLM`` (SmolLM2, the tiny test model) and its three
relatives (:data:`FAMILIES`), written for one scheduler step in which N tokens of many
requests go through the network together::

    x⁰      = E[tokens]                                            [N, D]
    for each layer l:
      h     = RMSNorm(x) = g ⊙ x / sqrt(mean(x²) + ε)
      q,k,v = h W_qkvᵀ (+ b_qkv)      (one fused matmul; biases: Qwen2)  [N, (H + 2H_kv)·d]
      q,k   = RMSNorm_d(q), RMSNorm_d(k)   per head, over d          (Qwen3 only)
      q,k   = RoPE(q, pos), RoPE(k, pos)
      K,V[slot, :, pos] ← k, v        (write this step's keys/values into the cache)
      o     = softmax(q Kᵀ / √d + causal mask) V   per request, GQA: query head h reads
                                                   KV head ⌊h / (H/H_kv)⌋, never repeated
      x     = x + o W_oᵀ (+ b_o)
      h     = RMSNorm(x)
      x     = x + (SiLU(h W_gateᵀ) ⊙ h W_upᵀ) W_downᵀ   (gate and up fused in one matmul)
    logits  = RMSNorm(x[rows]) W_lmᵀ  only for the rows that sample a token

A sliding attention window (Mistral) is not implemented: the engine refuses a context longer
than the window, inside which full causal attention is the model's attention exactly.

Decode rows (one token per running request) are the first ``n_decode`` rows and belong to
slots ``0 … n_decode-1`` (the scheduler keeps running requests packed at the front of the
cache), so their attention is one batched SDPA over the cache view ``K[:B, :, :L_max]``:
the G = H/H_kv query heads that share a KV head are laid out as G "query positions" of
that KV head, which is GQA without copying K/V. Prefill chunks (several tokens of one
request at positions ``start … start+n-1``) attend causally to their own slot.

The weights are the engine's own copy, fused once (``W_qkv``, ``W_gate_up``) and refreshed
in place by :meth:`LlamaWeights.load_` on every hot-load. The tests check the logits of
every family against HF's forward on a tiny random model of it to ≤ 1e-4 in fp32.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from provrl.engine import pages
from provrl.engine.api import EngineError

# ----------------------------------------------------------------------------- shape
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
"""HF ``model_type`` values this forward implements (all: RMSNorm, RoPE, GQA, SwiGLU):

* ``llama`` (SmolLM2, Llama 2/3) — biases on q/k/v/o only with ``attention_bias=True``;
* ``mistral`` — Llama's maths plus a sliding attention window (``sliding_window``);
* ``qwen2`` (Qwen2, Qwen2.5) — biases on q, k and v (never on o);
* ``qwen3`` — a per-head RMSNorm on q and on k before RoPE (``q_norm``, ``k_norm``);
  biases as ``attention_bias`` says."""


@dataclass(frozen=True)
class LlamaShape:
    """The architecture numbers of a Llama-family causal LM."""

    vocab_size: int
    hidden: int  # D
    n_layers: int
    n_heads: int  # H
    n_kv_heads: int  # H_kv
    head_dim: int  # d
    intermediate: int  # F (the MLP width)
    eps: float
    tied: bool
    family: str = "llama"
    """The HF ``model_type`` (one of :data:`FAMILIES`)."""
    qkv_bias: bool = False
    """q, k, v projections have biases (Qwen2/2.5; Llama/Qwen3 with attention_bias)."""
    o_bias: bool = False
    """The output projection has a bias (Llama/Qwen3 with attention_bias)."""
    qk_norm: bool = False
    """RMSNorm over the head dimension of q and k before RoPE (Qwen3)."""
    sliding_window: int | None = None
    """Attention window of the model (Mistral, Qwen with use_sliding_window); this forward
    attends to the whole context, which equals the model's forward up to this many tokens."""

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def n_params(self) -> int:
        """Parameter count (the tied embedding counted once)."""
        D, F_ = self.hidden, self.intermediate
        qkv = self.q_dim + 2 * self.kv_dim
        per_layer = D * qkv + self.q_dim * D + 3 * D * F_ + 2 * D
        per_layer += qkv * self.qkv_bias + D * self.o_bias + 2 * self.head_dim * self.qk_norm
        head = 0 if self.tied else self.vocab_size * D
        return self.vocab_size * D + self.n_layers * per_layer + D + head

    @classmethod
    def from_config(cls, cfg: Any) -> LlamaShape:
        """Read an HF config of a :data:`FAMILIES` model; anything this forward does not
        implement raises one :class:`EngineError` line that names it."""
        name = getattr(cfg, "name_or_path", "") or "?"
        family = str(getattr(cfg, "model_type", "llama"))
        if family not in FAMILIES:
            raise EngineError(
                f"model {name!r}: model_type {family!r} has no forward in the local engine "
                f"(it implements {', '.join(FAMILIES)}); missing: a {family} forward"
            )
        attention_bias = bool(getattr(cfg, "attention_bias", False))
        qkv_bias = {"qwen2": True, "mistral": False}.get(family, attention_bias)
        o_bias = family in ("llama", "qwen3") and attention_bias
        missing = []
        if getattr(cfg, "hidden_act", "silu") != "silu":
            missing.append(f"hidden_act={cfg.hidden_act!r} (only silu)")
        if getattr(cfg, "mlp_bias", False):
            missing.append("mlp_bias=True (MLP biases)")
        if float(getattr(cfg, "attention_dropout", 0.0) or 0.0) > 0:
            missing.append(f"attention_dropout={cfg.attention_dropout}")
        if missing:
            raise EngineError(
                f"model {name!r} ({family}): the local engine does not implement "
                f"{'; '.join(missing)}"
            )
        heads = int(cfg.num_attention_heads)
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        if heads % kv_heads:
            raise EngineError(f"num_attention_heads={heads} not a multiple of {kv_heads=}")
        return cls(
            vocab_size=int(cfg.vocab_size),
            hidden=int(cfg.hidden_size),
            n_layers=int(cfg.num_hidden_layers),
            n_heads=heads,
            n_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate=int(cfg.intermediate_size),
            eps=float(cfg.rms_norm_eps),
            tied=bool(getattr(cfg, "tie_word_embeddings", False)),
            family=family,
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            qk_norm=family == "qwen3",
            sliding_window=_sliding_window(cfg, family),
        )

    def check_context(self, max_context: int) -> None:
        """Raise if ``max_context`` tokens would reach past the model's attention window
        (this forward has no sliding window, so it is exact only inside one)."""
        if self.sliding_window is not None and max_context > self.sliding_window:
            raise EngineError(
                f"EngineConfig.max_context={max_context} exceeds the model's "
                f"sliding_window={self.sliding_window}: the local engine has no sliding-window "
                f"attention; set engine.max_context ≤ {self.sliding_window}"
            )


def _sliding_window(cfg: Any, family: str) -> int | None:
    """The attention window, if any layer of the model has one."""
    window = getattr(cfg, "sliding_window", None)
    if window is None:
        return None
    if family == "mistral":
        return int(window)
    layer_types = getattr(cfg, "layer_types", None) or ()
    return int(window) if "sliding_attention" in layer_types else None


# ----------------------------------------------------------------------------- weights
@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [D]
    w_qkv: torch.Tensor  # [(H + 2 H_kv) d, D]: rows q | k | v
    w_o: torch.Tensor  # [D, H d]
    post_norm: torch.Tensor  # [D]
    w_gate_up: torch.Tensor  # [2F, D]: rows gate | up
    w_down: torch.Tensor  # [D, F]
    b_qkv: torch.Tensor | None = None  # [(H + 2 H_kv) d]: q | k | v biases
    b_o: torch.Tensor | None = None  # [D]
    qk_norm: torch.Tensor | None = None  # [2, d]: q_norm | k_norm gains


@dataclass
class LlamaWeights:
    """The engine's own copy of the parameters, in fused layout."""

    shape: LlamaShape
    embed: torch.Tensor  # [V, D]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [D]
    lm_head: torch.Tensor  # [V, D]; the same tensor as ``embed`` when tied
    _targets: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    @classmethod
    def empty(cls, shape: LlamaShape, device: str, dtype: torch.dtype) -> LlamaWeights:
        def t(*size: int) -> torch.Tensor:
            return torch.empty(*size, device=device, dtype=dtype)

        S, D, F_ = shape, shape.hidden, shape.intermediate
        qkv = S.q_dim + 2 * S.kv_dim
        embed = t(S.vocab_size, D)
        layers = [
            LayerWeights(
                t(D),
                t(qkv, D),
                t(D, S.q_dim),
                t(D),
                t(2 * F_, D),
                t(D, F_),
                b_qkv=t(qkv) if S.qkv_bias else None,
                b_o=t(D) if S.o_bias else None,
                qk_norm=t(2, S.head_dim) if S.qk_norm else None,
            )
            for _ in range(S.n_layers)
        ]
        lm_head = embed if S.tied else t(S.vocab_size, D)
        return cls(shape, embed, layers, t(D), lm_head)

    @classmethod
    def from_hf(cls, model: Any, device: str, dtype: torch.dtype) -> LlamaWeights:
        """Copy an HF model's parameters into a new fused layout."""
        w = cls.empty(LlamaShape.from_config(model.config), device, dtype)
        w.load_(model.state_dict())
        return w

    def targets(self) -> dict[str, torch.Tensor]:
        """HF parameter name → the view of the fused tensors it is copied into."""
        if self._targets:
            return self._targets
        S, F_ = self.shape, self.shape.intermediate
        out: dict[str, torch.Tensor] = {"model.embed_tokens.weight": self.embed}
        for i, lw in enumerate(self.layers):
            p = f"model.layers.{i}."
            q, kv = S.q_dim, S.kv_dim
            out[p + "self_attn.q_proj.weight"] = lw.w_qkv[:q]
            out[p + "self_attn.k_proj.weight"] = lw.w_qkv[q : q + kv]
            out[p + "self_attn.v_proj.weight"] = lw.w_qkv[q + kv :]
            if lw.b_qkv is not None:
                out[p + "self_attn.q_proj.bias"] = lw.b_qkv[:q]
                out[p + "self_attn.k_proj.bias"] = lw.b_qkv[q : q + kv]
                out[p + "self_attn.v_proj.bias"] = lw.b_qkv[q + kv :]
            out[p + "self_attn.o_proj.weight"] = lw.w_o
            if lw.b_o is not None:
                out[p + "self_attn.o_proj.bias"] = lw.b_o
            if lw.qk_norm is not None:
                out[p + "self_attn.q_norm.weight"] = lw.qk_norm[0]
                out[p + "self_attn.k_norm.weight"] = lw.qk_norm[1]
            out[p + "mlp.gate_proj.weight"] = lw.w_gate_up[:F_]
            out[p + "mlp.up_proj.weight"] = lw.w_gate_up[F_:]
            out[p + "mlp.down_proj.weight"] = lw.w_down
            out[p + "input_layernorm.weight"] = lw.input_norm
            out[p + "post_attention_layernorm.weight"] = lw.post_norm
        out["model.norm.weight"] = self.norm
        if not S.tied:
            out["lm_head.weight"] = self.lm_head
        self._targets = out
        return out

    def match(
        self, state_dict: Mapping[str, Any], source: str = "state dict"
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Pair every target view with its source tensor; raise :class:`EngineError` naming
        the key on a missing / unexpected key or a shape mismatch. Nothing is modified."""
        targets = self.targets()
        ignorable = {"lm_head.weight"} if self.shape.tied else set()
        unexpected = sorted(k for k in state_dict if k not in targets and k not in ignorable)
        missing = sorted(k for k in targets if k not in state_dict)
        if missing:
            raise EngineError(
                f"{source}: missing {len(missing)} weight(s), e.g. {missing[:3]} "
                f"(expected HF {self.shape.family} parameter names)"
            )
        if unexpected:
            raise EngineError(
                f"{source}: unexpected key(s) {unexpected[:3]} for a {self.shape.family} model "
                f"(the local engine implements no such parameter)"
            )
        pairs = []
        for name, dst in targets.items():
            src = state_dict[name]
            if not isinstance(src, torch.Tensor):
                raise EngineError(f"{source}: {name!r} is a {type(src).__name__}, not a tensor")
            if tuple(src.shape) != tuple(dst.shape):
                raise EngineError(
                    f"{source}: {name!r} has shape {tuple(src.shape)}, "
                    f"the engine's model has {tuple(dst.shape)}"
                )
            pairs.append((dst, src))
        return pairs

    @torch.no_grad()
    def load_(self, state_dict: Mapping[str, Any], source: str = "state dict") -> None:
        """Validate, then copy every tensor into place (casting dtype/device as needed)."""
        for dst, src in self.match(state_dict, source):
            dst.copy_(src)

    @torch.no_grad()
    def copy_pairs_(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """The in-place copy of already-matched pairs (what a hot-load pauses for)."""
        for dst, src in pairs:
            dst.copy_(src)


# ----------------------------------------------------------------------------- rope
@dataclass
class Rope:
    """cos and sin⁻ = (−sin₁, sin₂) tables [max_context, d] (HF's rotary embedding
    evaluated once at every position)."""

    cos: torch.Tensor
    sin_signed: torch.Tensor

    @classmethod
    def from_hf(cls, model: Any, max_context: int, device: str, dtype: torch.dtype) -> Rope:
        shape = LlamaShape.from_config(model.config)
        shape.check_context(max_context)  # the tables cover positions the model attends to
        rotary = model.model.rotary_emb
        d = shape.head_dim
        pos = torch.arange(max_context, device=rotary.inv_freq.device)[None]
        probe = torch.zeros(1, 1, d, dtype=torch.float32, device=rotary.inv_freq.device)
        with torch.no_grad():
            cos, sin = rotary(probe, pos)
        sin_signed = torch.cat((-sin[0, :, : d // 2], sin[0, :, d // 2 :]), dim=-1)
        return cls(cos[0].to(device, dtype), sin_signed.to(device, dtype))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """RoPE(x) = x ⊙ cos + rotate_half(x) ⊙ sin for x [N, heads, d], cos [N, 1, d], with
    HF's rotate_half(x₁, x₂) = (−x₂, x₁) on the two halves of the last dimension.

    Written as x ⊙ cos + swap(x) ⊙ sin⁻ with swap(x₁, x₂) = (x₂, x₁) and
    sin⁻ = (−sin₁, sin₂), which is rotate_half(x) ⊙ sin term by term (three ops)."""
    n, h, d = x.shape
    swapped = x.view(n, h, 2, d // 2).flip(2).view(n, h, d)
    return torch.addcmul(x * cos, swapped, sin_signed)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """g ⊙ x / sqrt(mean(x²) + ε) over the last dimension, in fp32 like HF's LlamaRMSNorm
    (one fused op); ``weight=None`` leaves out the gain g."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return xf.to(x.dtype) if weight is None else weight * xf.to(x.dtype)


def qk_head_norm(qk: torch.Tensor, gains: torch.Tensor, n_q: int, eps: float) -> torch.Tensor:
    """Qwen3's q_norm / k_norm: RMSNorm over the head dimension d of every head of
    qk [N, H + H_kv, d], with gain ``gains[0]`` on the H query heads, ``gains[1]`` on the
    H_kv key heads."""
    out = rms_norm(qk, None, eps)
    out[:, :n_q].mul_(gains[0])
    out[:, n_q:].mul_(gains[1])
    return out


# ----------------------------------------------------------------------------- KV cache
class KVCache:
    """K and V of every slot: ``[layers, slots, H_kv, max_context, d]``."""

    def __init__(self, shape: LlamaShape, n_slots: int, max_context: int, device: str,
                 dtype: torch.dtype, release: bool = True, huge_pages: bool = False) -> None:  # fmt: skip
        size = (shape.n_layers, n_slots, shape.n_kv_heads, max_context, shape.head_dim)
        # zeros the OS commits page by page as they are written (4 KiB pages by default)
        self.k = pages.zeros(size, dtype, device, huge=huge_pages)
        self.v = pages.zeros(size, dtype, device, huge=huge_pages)
        self.release = release  # trim() gives pages back (EngineConfig.kv_release)

    def swap(self, a: int, b: int, len_a: int, len_b: int) -> None:
        """Exchange the first ``len_a`` / ``len_b`` positions of slots a and b."""
        for t in (self.k, self.v):
            tmp = t[:, a, :, :len_a].clone()
            t[:, a, :, :len_b] = t[:, b, :, :len_b]
            t[:, b, :, :len_a] = tmp

    def move(self, src: int, dst: int, n: int) -> None:
        """Copy the first ``n`` positions of slot ``src`` into slot ``dst``."""
        for t in (self.k, self.v):
            t[:, dst, :, :n] = t[:, src, :, :n]

    def trim(self, slot: int, n: int) -> int:
        """Give the OS back the pages of ``slot`` past its first ``n`` positions (every layer
        and head; :mod:`provrl.engine.pages`): the slot holds ``n`` tokens now, and what lies
        beyond is never read unmasked. Returns the bytes released (0 off Linux or CPU, or when
        built with ``release=False``)."""
        L, S, Hkv, C, d = self.k.shape
        if not self.release or n >= C:
            return 0
        # element ranges: per (layer, head) the tail [n, C) of the slot's positions; the whole
        # [H_kv, C, d] block of a layer at once when nothing is kept
        if n == 0:
            block = Hkv * C * d
            ranges = [((i * S + slot) * block, (i * S + slot + 1) * block) for i in range(L)]
        else:
            heads = [((i * S + slot) * Hkv + h) * C for i in range(L) for h in range(Hkv)]
            ranges = [((r + n) * d, (r + C) * d) for r in heads]
        return pages.release(self.k, ranges) + pages.release(self.v, ranges)


# ----------------------------------------------------------------------------- one step
@dataclass
class Chunk:
    """A prefill chunk: ``n`` tokens of slot ``slot`` at positions ``start … start+n-1``,
    occupying rows ``row … row+n-1`` of the step."""

    slot: int
    start: int
    row: int
    n: int


@dataclass
class StepInputs:
    tokens: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64
    slots: torch.Tensor  # [N] int64
    n_decode: int  # rows 0 … n_decode-1 are decode rows of slots 0 … n_decode-1
    chunks: list[Chunk]
    logit_rows: torch.Tensor  # [R] int64 rows whose next-token logits are needed


def attention(q: torch.Tensor, kv: KVCache, layer: int, x: StepInputs,
              decode_mask: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """Causal attention of this step's queries q [N, H, d] over the cache → [N, H·d]."""
    N, H, d = q.shape
    Hkv = kv.k.shape[2]
    G = H // Hkv
    K, V = kv.k[layer], kv.v[layer]
    B = x.n_decode
    od = None
    if B:
        assert decode_mask is not None
        L = decode_mask.shape[-1]
        # GQA without repeat: the G query heads of one KV head act as G query rows of it.
        # softmax(q Kᵀ/√d + mask) V as two batched matmuls: with one query per sequence the
        # step is bound by reading K and V, and this reads them once (measured 1.9× faster
        # than the SDPA CPU kernel at 2 threads, batch 64; docs/engine.md §9).
        qd = q[:B].view(B, Hkv, G, d)
        s = torch.matmul(qd, K[:B, :, :L].transpose(-1, -2)).mul_(d**-0.5).add_(decode_mask)
        od = torch.matmul(torch.softmax(s, dim=-1), V[:B, :, :L])
        if not x.chunks:
            return od.view(B, H * d)
    out = torch.empty(N, H, d, dtype=q.dtype, device=q.device)
    if od is not None:
        out[:B] = od.view(B, H, d)
    for c in x.chunks:
        qs = q[c.row : c.row + c.n].transpose(0, 1)[None]  # [1, H, n, d]
        Ks = K[c.slot, :, : c.start + c.n][None]  # [1, Hkv, start+n, d]
        Vs = V[c.slot, :, : c.start + c.n][None]
        if c.start == 0:
            os_ = F.scaled_dot_product_attention(qs, Ks, Vs, is_causal=True, enable_gqa=True)
        else:
            i = torch.arange(c.n, device=q.device)[:, None] + c.start
            j = torch.arange(c.start + c.n, device=q.device)[None, :]
            os_ = F.scaled_dot_product_attention(qs, Ks, Vs, attn_mask=j <= i, enable_gqa=True)
        out[c.row : c.row + c.n] = os_[0].transpose(0, 1)
    return out.view(N, H * d)


def mlp_block(h: torch.Tensor, post_norm: torch.Tensor, w_gate_up: torch.Tensor,
              w_down: torch.Tensor, eps: float, intermediate: int) -> torch.Tensor:  # fmt: skip
    """x + (SiLU(h W_gateᵀ) ⊙ h W_upᵀ) W_downᵀ with h = RMSNorm(x) (the part of a layer
    that ``EngineConfig.compile`` hands to torch.compile)."""
    gu = rms_norm(h, post_norm, eps) @ w_gate_up.t()  # [N, 2F]: gate | up
    act = F.silu(gu[:, :intermediate]).mul_(gu[:, intermediate:])  # [N, F]
    return torch.addmm(h, act, w_down.t())


@torch.no_grad()
def forward(
    w: LlamaWeights, kv: KVCache, rope: Rope, x: StepInputs, mlp: Callable[..., Any] = mlp_block
) -> torch.Tensor:
    """Run one scheduler step; write this step's K/V; return fp32 logits [R, V]."""
    S = w.shape
    N = x.tokens.shape[0]
    H, Hkv, d = S.n_heads, S.n_kv_heads, S.head_dim
    qk_dim = S.q_dim + S.kv_dim
    h = F.embedding(x.tokens, w.embed)  # [N, D]
    cos = rope.cos[x.positions][:, None, :]  # [N, 1, d]
    sin = rope.sin_signed[x.positions][:, None, :]
    decode_mask = None
    if x.n_decode:
        lens = x.positions[: x.n_decode] + 1
        L = int(lens.max())
        past = torch.arange(L, device=lens.device)[None, :] < lens[:, None]
        decode_mask = torch.zeros(past.shape, dtype=h.dtype, device=h.device)
        # additive, [B, 1, 1, L]: broadcast over KV heads and the G query heads of each
        decode_mask = decode_mask.masked_fill_(~past, float("-inf"))[:, None, None]
    for layer, lw in enumerate(w.layers):
        hn = rms_norm(h, lw.input_norm, S.eps)  # [N, D]
        qkv = hn @ lw.w_qkv.t() if lw.b_qkv is None else torch.addmm(lw.b_qkv, hn, lw.w_qkv.t())
        # qkv: [N, (H + 2·H_kv)·d]; qk: [N, H + H_kv, d]
        qk = qkv[:, :qk_dim].view(N, H + Hkv, d)
        if lw.qk_norm is not None:
            qk = qk_head_norm(qk, lw.qk_norm, H, S.eps)
        qk = apply_rope(qk, cos, sin)  # q and k at once
        kv.k[layer][x.slots, :, x.positions] = qk[:, H:]
        kv.v[layer][x.slots, :, x.positions] = qkv[:, qk_dim:].view(N, Hkv, d)
        o = attention(qk[:, :H], kv, layer, x, decode_mask)  # [N, H·d]
        h = torch.addmm(h if lw.b_o is None else h + lw.b_o, o, lw.w_o.t())  # x + o W_oᵀ + b_o
        h = mlp(h, lw.post_norm, lw.w_gate_up, lw.w_down, S.eps, S.intermediate)
    last = rms_norm(h[x.logit_rows], w.norm, S.eps)  # [R, D]
    # (W hᵀ)ᵀ rather than h Wᵀ: MKL splits the 49k vocabulary rows across threads
    # (1.35× faster at 2 threads for 64 rows; the same values up to summation order)
    return (w.lm_head @ last.t()).t().float().contiguous()
