"""The slim Llama forward against HF's, and weight loading into the fused layout."""

from __future__ import annotations

import pytest
import torch

from provrl.engine import EngineError
from provrl.engine.llama import (
    Chunk,
    KVCache,
    LlamaShape,
    LlamaWeights,
    Rope,
    StepInputs,
    forward,
)


def build(tiny, slots=4, ctx=128):
    w = LlamaWeights.from_hf(tiny.model, "cpu", torch.float32)
    return (
        w,
        KVCache(w.shape, slots, ctx, "cpu", torch.float32),
        Rope.from_hf(tiny.model, ctx, "cpu", torch.float32),
    )


def test_chunked_prefill_then_batched_decode_equals_hf_logits(tiny):
    """Two requests of different lengths: prefill in uneven chunks (one of them mixed into
    a decode step), then decode both together; every logit row equals HF's full forward."""
    w, kv, rope = build(tiny)
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 5000, (23,), generator=g).tolist()
    b = torch.randint(0, 5000, (9,), generator=g).tolist()
    with torch.no_grad():
        ref_a = tiny.model(torch.tensor([a])).logits[0]
        ref_b = tiny.model(torch.tensor([b])).logits[0]

    def step(tokens, positions, slots, n_decode, chunks, rows):
        x = StepInputs(
            torch.tensor(tokens), torch.tensor(positions), torch.tensor(slots), n_decode,
            chunks, torch.tensor(rows, dtype=torch.int64),
        )  # fmt: skip
        return forward(w, kv, rope, x)

    # step 1: a[0:10] in slot 0 (no logits) + b[0:8] in slot 1 (no logits)
    step(a[:10] + b[:8], list(range(10)) + list(range(8)), [0] * 10 + [1] * 8, 0,
         [Chunk(0, 0, 0, 10), Chunk(1, 0, 10, 8)], [])  # fmt: skip
    # step 2: b[8] as a 1-token chunk with logits, a[10:23] continuing its prefill
    out = step([b[8], *a[10:23]], [8, *range(10, 23)], [1] + [0] * 13, 0,
               [Chunk(1, 8, 0, 1), Chunk(0, 10, 1, 13)], [0, 13])  # fmt: skip
    torch.testing.assert_close(out[0], ref_b[8], atol=1e-4, rtol=0)
    torch.testing.assert_close(out[1], ref_a[22], atol=1e-4, rtol=0)
    # step 3: both decode (slots 0 and 1 at different lengths), feeding fixed tokens
    nxt = [11, 12]
    out = step(nxt, [23, 9], [0, 1], 2, [], [0, 1])
    with torch.no_grad():
        ra = tiny.model(torch.tensor([[*a, 11]])).logits[0, -1]
        rb = tiny.model(torch.tensor([[*b, 12]])).logits[0, -1]
    torch.testing.assert_close(out[0], ra, atol=1e-4, rtol=0)
    torch.testing.assert_close(out[1], rb, atol=1e-4, rtol=0)


def test_shape_and_param_count(tiny):
    s = LlamaShape.from_config(tiny.model.config)
    assert (s.n_heads, s.n_kv_heads, s.head_dim, s.tied) == (4, 2, 16, True)
    assert s.n_params == sum(p.numel() for p in tiny.model.parameters())


def test_weights_are_the_engines_own_copy(tiny):
    w = LlamaWeights.from_hf(tiny.model, "cpu", torch.float32)
    q = tiny.model.model.layers[0].self_attn.q_proj.weight
    assert w.layers[0].w_qkv.data_ptr() != q.data_ptr()
    torch.testing.assert_close(w.layers[0].w_qkv[: q.shape[0]], q.detach(), atol=0, rtol=0)


def test_state_dict_errors_name_the_key(tiny):
    w = LlamaWeights.from_hf(tiny.model, "cpu", torch.float32)
    sd = dict(tiny.model.state_dict())
    before = w.layers[1].w_down.clone()
    bad = dict(sd)
    bad["model.layers.1.mlp.down_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(EngineError, match=r"model\.layers\.1\.mlp\.down_proj\.weight.*\(3, 3\)"):
        w.load_(bad)
    missing = {k: v for k, v in sd.items() if "layers.0.self_attn.k_proj" not in k}
    with pytest.raises(EngineError, match=r"missing 1 weight.*k_proj"):
        w.load_(missing)
    with pytest.raises(EngineError, match="unexpected key"):
        w.load_({**sd, "model.extra.weight": torch.zeros(1)})
    torch.testing.assert_close(w.layers[1].w_down, before, atol=0, rtol=0)  # untouched


def test_unsupported_architecture_is_rejected(tiny):
    cfg = tiny.model.config.__class__(**tiny.model.config.to_dict())
    cfg.mlp_bias = True  # (attention_bias is supported: tests/engine/test_families.py)
    with pytest.raises(EngineError, match="mlp_bias"):
        LlamaShape.from_config(cfg)
