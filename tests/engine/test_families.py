"""Every model family the engine implements, token-exact against the transformers forward.

A tiny random model of each family (``tiny-mistral``, ``tiny-qwen2``, ``tiny-qwen3``; biases
and norm gains randomised, so dropping one changes the output) goes through the slim
forward in chunked prefill + batched decode, and through the engine: every logit row and
every recorded behaviour logprob must equal HF's, and greedy decoding must give HF
``generate``'s tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from provrl.engine import EngineError, generate
from provrl.engine.llama import Chunk, KVCache, LlamaShape, LlamaWeights, Rope, StepInputs, forward
from provrl.models import load_model, stop_token_ids
from provrl.provenance import SamplingParams

FAMILIES = ["tiny-mistral", "tiny-qwen2", "tiny-qwen3"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return load_model(request.param, seed=3)


def test_the_tiny_models_are_the_families_they_claim(family):
    s = LlamaShape.from_config(family.model.config)
    expected = {
        "tiny-mistral": ("mistral", False, False, 4096),
        "tiny-qwen2": ("qwen2", True, False, None),
        "tiny-qwen3": ("qwen3", False, True, None),
    }[family.name]
    assert (s.family, s.qkv_bias, s.qk_norm, s.sliding_window) == expected
    assert s.n_params == sum(p.numel() for p in family.model.parameters())
    sd = family.model.state_dict()
    if s.qkv_bias:  # the biases are random, not HF's zero init
        assert sd["model.layers.0.self_attn.k_proj.bias"].abs().min() > 0
    if s.qk_norm:
        assert not torch.allclose(sd["model.layers.1.self_attn.q_norm.weight"], torch.ones(16))


def test_chunked_prefill_and_decode_equal_hf_logits(family):
    w = LlamaWeights.from_hf(family.model, "cpu", torch.float32)
    kv = KVCache(w.shape, 2, 64, "cpu", torch.float32)
    rope = Rope.from_hf(family.model, 64, "cpu", torch.float32)
    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, 5000, (21,), generator=g).tolist()
    b = torch.randint(0, 5000, (7,), generator=g).tolist()

    def step(tokens, positions, slots, n_decode, chunks, rows):
        x = StepInputs(
            torch.tensor(tokens), torch.tensor(positions), torch.tensor(slots), n_decode,
            chunks, torch.tensor(rows, dtype=torch.int64),
        )  # fmt: skip
        return forward(w, kv, rope, x)

    step(a[:12] + b, list(range(12)) + list(range(7)), [0] * 12 + [1] * 7, 0,
         [Chunk(0, 0, 0, 12), Chunk(1, 0, 12, 7)], [])  # fmt: skip
    out = step(a[12:], list(range(12, 21)), [0] * 9, 0, [Chunk(0, 12, 0, 9)], list(range(9)))
    with torch.no_grad():
        ref = family.model(torch.tensor([a])).logits[0]
    torch.testing.assert_close(out, ref[12:], atol=1e-4, rtol=0)
    out = step([5, 6], [21, 7], [0, 1], 2, [], [0, 1])
    with torch.no_grad():
        ra = family.model(torch.tensor([[*a, 5]])).logits[0, -1]
        rb = family.model(torch.tensor([[*b, 6]])).logits[0, -1]
    torch.testing.assert_close(out, torch.stack([ra, rb]), atol=1e-4, rtol=0)


def test_engine_logprobs_and_greedy_tokens_equal_hf(family, make_engine, prompts, teacher):
    eng = make_engine(family, max_context=128)
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=2)
    futs = [eng.submit(p, params) for p in prompts[:3]]
    for p, f in zip(prompts, futs, strict=False):
        out = f.result(timeout=120)
        ref = teacher(family.model, p + out.token_ids)[len(p) :]
        np.testing.assert_allclose(out.logprob, ref.numpy(), atol=1e-4, rtol=0)
    greedy = generate(eng, prompts[0], SamplingParams(temperature=0.0, max_new_tokens=10))
    x = torch.tensor([prompts[0]])
    with torch.no_grad():
        hf = family.model.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=10, do_sample=False,
            eos_token_id=list(stop_token_ids(family.tokenizer)),
            pad_token_id=family.tokenizer.pad_token_id,
        )  # fmt: skip
    assert greedy.token_ids == hf[0, x.shape[1] :].tolist()


def test_dropping_a_family_feature_is_caught(family):
    """The test above can fail: the forward without the family's extra (biases zeroed,
    q/k norm gains reset) no longer equals HF."""
    s = LlamaShape.from_config(family.model.config)
    if not (s.qkv_bias or s.qk_norm):
        pytest.skip("Mistral adds nothing to Llama's parameters")
    w = LlamaWeights.from_hf(family.model, "cpu", torch.float32)
    for lw in w.layers:
        if lw.b_qkv is not None:
            lw.b_qkv.zero_()
        if lw.qk_norm is not None:
            lw.qk_norm.fill_(1.0)
    kv = KVCache(w.shape, 1, 16, "cpu", torch.float32)
    rope = Rope.from_hf(family.model, 16, "cpu", torch.float32)
    ids = list(range(100, 110))
    x = StepInputs(
        torch.tensor(ids), torch.arange(10), torch.zeros(10, dtype=torch.int64), 0,
        [Chunk(0, 0, 0, 10)], torch.tensor([9]),
    )  # fmt: skip
    with torch.no_grad():
        ref = family.model(torch.tensor([ids])).logits[0, -1]
    assert (forward(w, kv, rope, x)[0] - ref).abs().max() > 1e-2


def test_context_beyond_the_sliding_window_is_refused():
    lm = load_model("tiny-mistral")
    with pytest.raises(EngineError, match=r"sliding_window=4096.*max_context ≤ 4096"):
        Rope.from_hf(lm.model, 8192, "cpu", torch.float32)


def test_an_unsupported_architecture_fails_with_one_line_naming_it(tiny):
    from transformers import AutoConfig

    gemma = AutoConfig.for_model("gemma2", vocab_size=64, hidden_size=32, num_hidden_layers=1)
    with pytest.raises(
        EngineError, match=r"model_type 'gemma2'.*llama, mistral, qwen2, qwen3"
    ) as e:
        LlamaShape.from_config(gemma)
    assert "\n" not in str(e.value)
    cfg = tiny.model.config.__class__(**tiny.model.config.to_dict())
    cfg.mlp_bias, cfg.hidden_act = True, "gelu"
    with pytest.raises(EngineError, match=r"hidden_act='gelu'.*mlp_bias=True") as e:
        LlamaShape.from_config(cfg)
    assert "\n" not in str(e.value)


def test_llama_with_attention_bias_is_exact(tiny):
    """Llama's ``attention_bias=True`` (biases on q, k, v and o) is supported now."""
    from transformers import LlamaForCausalLM

    cfg = tiny.model.config.__class__(**tiny.model.config.to_dict())
    cfg.attention_bias = True
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.normal_(0, 0.5)
    w = LlamaWeights.from_hf(model, "cpu", torch.float32)
    assert w.shape.qkv_bias and w.shape.o_bias
    kv = KVCache(w.shape, 1, 16, "cpu", torch.float32)
    rope = Rope.from_hf(model, 16, "cpu", torch.float32)
    ids = list(range(200, 212))
    x = StepInputs(
        torch.tensor(ids), torch.arange(12), torch.zeros(12, dtype=torch.int64), 0,
        [Chunk(0, 0, 0, 12)], torch.arange(12),
    )  # fmt: skip
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(forward(w, kv, rope, x), ref, atol=1e-4, rtol=0)
