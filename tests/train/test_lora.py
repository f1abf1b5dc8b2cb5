"""LoRA on the RL trainer (tiny Llama): adapters train, base weights stay, engines get merged."""

from __future__ import annotations

import copy

import torch
from test_rl import fresh, make_batch

from provrl.objectives.config import ObjectiveConfig
from provrl.train.config import LoraConfig, RLConfig
from provrl.train.logprobs import token_logprobs_chunked
from provrl.train.lora import add_lora, merged_state_dict
from provrl.train.rl import RLTrainer, prepare_batch, published_weights

LORA = LoraConfig(enabled=True, r=4, alpha=8)


def _cfg() -> RLConfig:
    return RLConfig(lr=1e-2, objective=ObjectiveConfig(correction="tis"), lora=LORA)


def test_lora_step_moves_only_adapters_and_publishes_the_merged_weights(tiny, prompts):
    pad = tiny.tokenizer.pad_token_id
    plain = published_weights(tiny.model)
    trajs = fresh(make_batch(tiny.model, prompts))
    trainer = RLTrainer(copy.deepcopy(tiny.model), _cfg(), pad_token_id=pad)
    model = trainer.model
    assert all(".lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    assert {id(p) for p in trainer.params} == {
        id(p) for n, p in model.named_parameters() if ".lora_" in n
    }
    before = {k: v.clone() for k, v in model.state_dict().items()}

    result = trainer.step(trajs)

    assert result.skipped is None and result.version == 1
    after = model.state_dict()
    changed = {k for k, v in after.items() if not torch.equal(v, before[k])}
    assert changed and all(".lora_B" in k for k in changed)  # A's grad is 0 while B = 0
    # published: the plain model's names and dtypes, W + (alpha / r)·B·A
    sd = result.state_dict
    assert sd.keys() == plain.keys()
    assert all(sd[k].dtype == plain[k].dtype and sd[k].shape == plain[k].shape for k in sd)
    assert sd["lm_head.weight"].data_ptr() == sd["model.embed_tokens.weight"].data_ptr()
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    ref = get_peft_model(
        copy.deepcopy(tiny.model),
        PeftLoraConfig(r=4, lora_alpha=8, target_modules=list(LORA.target_modules)),
    )
    ref.load_state_dict({f"base_model.model.{k}": v for k, v in after.items()}, strict=False)
    merged = ref.merge_and_unload().state_dict()
    assert all(torch.allclose(sd[k], merged[k], rtol=0, atol=1e-6) for k in sd)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(sd[q], plain[q])


def test_lora_policy_at_init_has_the_base_logprobs(tiny, prompts):
    trajs = make_batch(tiny.model, prompts)
    pad = tiny.tokenizer.pad_token_id
    batch, _ = prepare_batch(trajs, pad_token_id=pad, vocab_size=49152, cfg=_cfg().advantages)
    tb = batch.tb
    lora = add_lora(copy.deepcopy(tiny.model), LORA)
    with torch.no_grad():
        base, adapted = (
            token_logprobs_chunked(
                m, tb.input_ids, tb.attention_mask, positions=tb.action_mask
            ).logprobs
            for m in (tiny.model, lora)
        )
    assert torch.equal(base, adapted)
    merged = merged_state_dict(lora)
    assert all(torch.equal(v, tiny.model.state_dict()[k]) for k, v in merged.items())


def test_a_lora_checkpoint_is_a_plain_model_and_resumes_and_rolls_back(tiny, prompts, tmp_path):
    """Saved: the merged weights as a plain model (what eval loads) plus RNG and step count;
    a resumed or rolled-back learner puts fresh adapters on those weights."""
    import dataclasses

    from provrl.models import load_model
    from provrl.train.learner import LocalLearner

    cfg = RLConfig(lr=1e-2, lora=LORA, minibatches=2)
    a = LocalLearner(dataclasses.replace(tiny, model=copy.deepcopy(tiny.model)), cfg, version=0)
    first = a.step(make_batch(tiny.model, prompts, tokens=4))
    a.save(tmp_path / "ckpt", kind="rl", version=1)
    plain = load_model(str(tmp_path / "ckpt"))
    on_disk = plain.model.state_dict()
    assert on_disk.keys() == tiny.model.state_dict().keys()
    assert all(torch.equal(on_disk[k], first.weights[k]) for k in on_disk)

    b = LocalLearner(plain, cfg, version=1, optimizer_state=tmp_path / "ckpt")
    assert b.trainer.optimizer_steps == a.trainer.optimizer_steps == 2
    second = b.step(make_batch(tiny.model, prompts, tokens=4))
    assert second.version == 2 and second.skipped is None

    a.step(make_batch(tiny.model, prompts, tokens=4))  # moves the adapters again
    a.rollback()  # back to the saved merged weights, adapters at B = 0
    back = published_weights(a.trainer.model)
    assert all(torch.equal(back[k], on_disk[k]) for k in on_disk)
    assert a.trainer.optimizer_steps == 2


def test_gradient_checkpointing_gives_the_same_step_with_fewer_saved_activations(tiny, prompts):
    pad = tiny.tokenizer.pad_token_id
    trajs = make_batch(tiny.model, prompts)
    out = []
    for gc in (False, True):
        cfg = RLConfig(
            lr=1e-3, gradient_checkpointing=gc, objective=ObjectiveConfig(correction="tis")
        )
        trainer = RLTrainer(copy.deepcopy(tiny.model), cfg, pad_token_id=pad)
        out.append(trainer.step(fresh(trajs)))
    plain, ckpt = out
    assert plain.metrics["loss"] == ckpt.metrics["loss"]
    assert plain.metrics["grad_norm"] == ckpt.metrics["grad_norm"]
    assert all(torch.equal(plain.state_dict[k], ckpt.state_dict[k]) for k in plain.state_dict)
    assert ckpt.metrics["mem_activations_mib"] < plain.metrics["mem_activations_mib"]
