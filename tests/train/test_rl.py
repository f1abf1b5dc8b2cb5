"""The LLM RL trainer on the tiny Llama with real, sampled provenance trajectories."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from conftest import even_fraction, sample_group

from provrl.objectives.config import AdvantageConfig, ObjectiveConfig, TRPOConfig
from provrl.objectives.losses import loss_token_weights, policy_loss
from provrl.provenance import ProvenanceError
from provrl.report.metrics import MetricsWriter, read_metrics
from provrl.train.config import RLConfig
from provrl.train.logprobs import token_logprobs_chunked
from provrl.train.rl import RLTrainer, prepare_batch


def make_batch(model, prompts, *, n=4, tokens=6, reward=even_fraction, tasks=2, **kw):
    out = []
    for j, (task_id, ids) in enumerate(prompts[:tasks]):
        out += sample_group(
            model, ids, task_id=task_id, n=n, max_new_tokens=tokens, reward=reward, seed=j, **kw
        )
    return out


def batch_loss(model, trajs, prox_logprobs, cfg: RLConfig, pad: int) -> float:
    """The objective's loss of ``trajs`` under ``model``'s weights, with π_prox fixed."""
    batch, _ = prepare_batch(trajs, pad_token_id=pad, vocab_size=49152, cfg=cfg.advantages)
    tb = batch.tb
    with torch.no_grad():
        logp = token_logprobs_chunked(
            model, tb.input_ids, tb.attention_mask, positions=tb.action_mask
        ).logprobs
        w = loss_token_weights(tb.action_mask, cfg.objective.aggregation)
        out = policy_loss(
            logp,
            prox_logprobs,
            tb.behaviour_logprobs,
            batch.token_advantages,
            tb.action_mask,
            w,
            cfg.objective,
        )
    return float(out.loss)


def sequence_logprob(model, trajs, pad: int) -> torch.Tensor:
    batch, _ = prepare_batch(trajs, pad_token_id=pad, vocab_size=49152, cfg=AdvantageConfig())
    tb = batch.tb
    with torch.no_grad():
        lp = token_logprobs_chunked(
            model, tb.input_ids, tb.attention_mask, positions=tb.action_mask
        ).logprobs
    return (lp * tb.action_mask).sum(-1)


@pytest.fixture
def model(tiny):
    return copy.deepcopy(tiny.model)  # the session model must stay untouched


@pytest.fixture(scope="module")
def sampled(tiny, prompts):
    """2 tasks × 4 trajectories × 6 tokens sampled by the tiny model at T = 1 (version 0)."""
    return make_batch(tiny.model, prompts)


def fresh(trajs, **changes):
    out = copy.deepcopy(trajs)
    for t in out:
        for k, v in changes.items():
            setattr(t, k, v)
    return out


def test_grpo_step_changes_the_weights_and_reduces_the_loss(tiny, model, sampled, tmp_path):
    pad = tiny.tokenizer.pad_token_id
    trajs = fresh(sampled)
    cfg = RLConfig(lr=1e-3, objective=ObjectiveConfig(correction="tis"))
    writer = MetricsWriter(tmp_path, tensorboard=False)
    trainer = RLTrainer(model, cfg, pad_token_id=pad, metrics=writer)
    batch, _ = prepare_batch(trajs, pad_token_id=pad, vocab_size=49152, cfg=cfg.advantages)
    assert batch.advantages.abs().sum() > 0, "toy reward gave no signal; change the seed"
    prox = trainer.proximal_pass(batch).logprobs
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loss_before = batch_loss(model, trajs, prox, cfg, pad)
    logp_before = sequence_logprob(model, trajs, pad)

    result = trainer.step(trajs)

    assert result.version == 1 and trainer.version == 1
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed, "no weight changed"
    assert all(torch.equal(result.state_dict[k], v) for k, v in model.state_dict().items())
    assert result.state_dict["lm_head.weight"].data_ptr() != model.lm_head.weight.data_ptr()
    loss_after = batch_loss(model, trajs, prox, cfg, pad)
    assert loss_after < loss_before
    # the policy moved towards the better-than-group trajectories
    delta = sequence_logprob(model, trajs, pad) - logp_before
    assert float((batch.advantages * delta).sum()) > 0
    writer.close()
    (row,) = read_metrics(tmp_path / "metrics.jsonl")
    for key in (
        "rl/loss",
        "rl/kl_q_pi_k3",
        "rl/kl_q_pi_k3_max",
        "rl/tv",
        "rl/clip_frac",
        "rl/ratio_q50",
        "rl/ess_frac",
        "rl/truncated_frac",
        "rl/lag_frac_0",
        "rl/zero_signal_group_frac",
        "rl/entropy",
        "rl/grad_norm",
    ):
        assert key in row, key
    assert row["step"] == 1


def test_recorded_logprobs_match_the_trainers_teacher_forced_logprobs(tiny, model, prompts):
    """Alignment: logprob[t] belongs to token t and uses the logits at t−1. With the same
    weights the proximal pass must reproduce the sampler's log q exactly (ratio 1)."""
    pad = tiny.tokenizer.pad_token_id
    trajs = make_batch(model, prompts, n=2, temperature=0.7, tokens=4)
    trainer = RLTrainer(model, RLConfig(), pad_token_id=pad)
    batch, _ = prepare_batch(trajs, pad_token_id=pad, vocab_size=49152, cfg=AdvantageConfig())
    prox = trainer.proximal_pass(batch)
    m = batch.mask
    torch.testing.assert_close(prox.logprobs[m], batch.tb.behaviour_logprobs[m], atol=2e-4, rtol=0)
    d = trainer.diagnostics(batch, prox)
    assert d["kl_q_pi_k3_max"] < 1e-6 and d["ess_frac"] > 0.999
    assert d["lag_frac_0"] == 1.0 and d["truncated_frac"] == 0.0


@pytest.mark.parametrize(
    "adv",
    [AdvantageConfig(), AdvantageConfig(std_normalise=False), AdvantageConfig(estimator="rloo")],
)
def test_all_equal_groups_give_zero_gradient(tiny, model, sampled, adv):
    pad = tiny.tokenizer.pad_token_id
    trajs = fresh(sampled, reward=0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = RLConfig(lr=1e-2, advantages=adv, objective=ObjectiveConfig(correction="seq_tis"))
    result = RLTrainer(model, cfg, pad_token_id=pad).step(trajs)
    assert result.metrics["zero_signal_group_frac"] == 1.0
    for p in model.parameters():
        assert p.grad is not None and torch.count_nonzero(p.grad) == 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_micro_batching_accumulates_the_exact_minibatch_gradient(tiny, sampled):
    pad = tiny.tokenizer.pad_token_id
    trajs = fresh(sampled)
    for t in trajs[::3]:  # unequal lengths: drop the last two actions of some trajectories
        keep = len(t) - 2
        for name in t.columns():
            setattr(t, name, getattr(t, name)[:keep])
        t.segments[-1] = type(t.segments[-1])("action", t.segments[-1].start, keep)
        t.validate()
    grads = []
    for micro in (1, 8):
        m = copy.deepcopy(tiny.model)
        cfg = RLConfig(
            micro_batch_size=micro,
            max_grad_norm=None,
            objective=ObjectiveConfig(correction="icepop", aggregation="seq_mean_token_mean"),
        )
        RLTrainer(m, cfg, pad_token_id=pad).step(trajs)
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    assert grads[0].abs().max() > 0
    for g in grads[1:]:
        torch.testing.assert_close(g, grads[0], rtol=1e-4, atol=1e-6)


def test_stale_and_truncated_batches_show_up_in_the_diagnostics(tiny, prompts):
    pad = tiny.tokenizer.pad_token_id
    trajs = make_batch(tiny.model, prompts, n=2, top_p=0.5, version=0, tokens=3)
    drifted = copy.deepcopy(tiny.model)
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in drifted.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    trainer = RLTrainer(drifted, RLConfig(), pad_token_id=pad, version=3)
    batch, _ = prepare_batch(trajs, pad_token_id=pad, vocab_size=49152, cfg=AdvantageConfig())
    d = trainer.diagnostics(batch, trainer.proximal_pass(batch))
    assert d["lag_mean"] == 3.0 and d["lag_frac_ge4"] == 0.0 and d["lag_frac_3"] == 1.0
    assert d["truncated_frac"] == 1.0 and d["q_excluded_mass"] > 0.3
    assert d["pi_excluded_mass"] > 0.3  # π_θ mass the top-p sampler could never produce
    assert d["kl_q_pi_k3"] > 1e-3 and d["ess_frac"] < 1.0
    assert d["ratio_q01"] < 1.0 < d["ratio_q99"] or d["ratio_max"] < 1.0


def test_trpo_step_stays_inside_the_trust_region(tiny, model, sampled):
    pad = tiny.tokenizer.pad_token_id
    trajs = fresh(sampled)
    old_model = copy.deepcopy(model)
    cfg = RLConfig(
        optimizer="trpo",
        objective=ObjectiveConfig(correction="token_is"),
        trpo=TRPOConfig(delta=0.01, cg_iters=3),
    )
    result = RLTrainer(model, cfg, pad_token_id=pad).step(trajs)
    m = result.metrics
    assert m["trpo_accepted"] == 1.0
    assert 0 < m["trpo_kl"] <= 0.01 and m["trpo_improvement"] > 0
    changed = [
        not torch.equal(p, b)
        for p, b in zip(model.parameters(), old_model.parameters(), strict=True)
    ]
    assert any(changed)
    # the constrained quantity, recomputed from plain full-vocabulary logits of the old and
    # new weights: mean over action tokens of KL(π_old(·|h_t) ‖ π_new(·|h_t))
    batch, _ = prepare_batch(trajs, pad_token_id=pad, vocab_size=49152, cfg=cfg.advantages)
    tb = batch.tb
    with torch.no_grad():
        logits = [
            net(input_ids=tb.input_ids, attention_mask=tb.attention_mask.long()).logits.double()
            for net in (old_model, model)
        ]
    b, t = tb.action_mask.nonzero(as_tuple=True)
    old, new = (torch.log_softmax(z[b, t - 1], -1) for z in logits)
    kl = float((old.exp() * (old - new)).sum(-1).mean())
    assert kl == pytest.approx(m["trpo_kl"], rel=1e-3)


def test_bad_input_is_named(tiny, model, sampled):
    pad = tiny.tokenizer.pad_token_id
    trajs = fresh(sampled[:2])
    trainer = RLTrainer(model, RLConfig(), pad_token_id=pad)
    trajs[1].reward = None
    with pytest.raises(ProvenanceError, match=r"task0-1.*no finite reward"):
        trainer.step(trajs)
    trajs[1].reward = 0.0
    trajs[0].token_id[-1] = 60_000
    with pytest.raises(ProvenanceError, match=r"task0-0.*vocab"):
        trainer.step(trajs)
    with pytest.raises(ValueError, match="at least one"):
        trainer.step([])
    with pytest.raises(ValueError, match="epochs=1"):
        RLConfig(optimizer="trpo", epochs=2)


def test_kl_penalty_and_several_minibatches_run_and_report(tiny, model, sampled):
    pad = tiny.tokenizer.pad_token_id
    trajs = fresh(sampled)
    cfg = RLConfig(
        lr=1e-3,
        epochs=2,
        minibatches=2,
        micro_batch_size=2,
        objective=ObjectiveConfig(correction="decoupled", kl_coef=0.1, kl_estimator="k2"),
    )
    trainer = RLTrainer(model, cfg, pad_token_id=pad)
    m1 = trainer.step(trajs).metrics
    assert m1["optimizer_steps"] == 4 and m1["kl_ref"] >= 0
    m2 = trainer.step(trajs).metrics
    assert m2["kl_ref"] > 0  # the policy has moved away from the frozen reference
    assert trainer.version == 2 and math.isfinite(m2["loss"])
    assert np.isfinite([v for v in m2.values()]).all()


def test_grpo_improves_the_exact_expected_reward(tiny, model, prompts):
    """Toy task: reward 1 when the first sampled token is a newline (id 198). At T = 0.1
    the tiny model starts with π(198 | prompt) ≈ 0.3, and J = π(198 | prompt) is exact."""
    pad, ids = tiny.tokenizer.pad_token_id, prompts[0][1]
    temp = 0.1

    def exact_j() -> float:
        with torch.no_grad():
            z = model(input_ids=torch.tensor([ids]), logits_to_keep=1).logits[0, -1]
        return float(torch.softmax(z.double() / temp, -1)[198])

    trainer = RLTrainer(model, RLConfig(lr=1e-3), pad_token_id=pad)
    j0 = exact_j()
    for step in range(3):
        trajs = sample_group(
            model,
            ids,
            task_id="newline",
            n=8,
            max_new_tokens=1,
            reward=lambda a: float(a[0] == 198),
            temperature=temp,
            version=trainer.version,
            seed=100 + step,
        )
        trainer.step(trajs)
    assert 0.2 < j0 < 0.4
    assert exact_j() > j0 + 0.15


def test_bfloat16_autocast_step_is_close_to_float32_and_keeps_float32_weights(tiny, model, sampled):
    """cfg.autocast = bfloat16: the proximal pass differs from float32 only by bf16 rounding,
    weights and optimizer state stay float32, and the update still follows the advantages."""
    pad = tiny.tokenizer.pad_token_id
    trajs = fresh(sampled)
    f32 = RLTrainer(copy.deepcopy(model), RLConfig(lr=1e-3), pad_token_id=pad)
    bf16 = RLTrainer(model, RLConfig(lr=1e-3, autocast="bfloat16"), pad_token_id=pad)
    batch, _ = prepare_batch(trajs, pad_token_id=pad, vocab_size=49152, cfg=AdvantageConfig())
    a, b = f32.proximal_pass(batch).logprobs, bf16.proximal_pass(batch).logprobs
    m = batch.mask
    assert a.dtype == b.dtype == torch.float32
    err = (a - b)[m].abs()
    assert 0 < float(err.max()) < 0.1  # bf16 rounding: visible, small
    logp_before = sequence_logprob(model, trajs, pad)
    result = bf16.step(trajs)
    assert all(v.dtype == torch.float32 for v in result.state_dict.values())
    delta = sequence_logprob(model, trajs, pad) - logp_before
    assert float((batch.advantages * delta).sum()) > 0


def test_progress_counts_the_trained_share_of_the_step(tiny, sampled, monkeypatch):
    """RLTrainer.progress: the share of the step's row tokens whose forward and backward are
    done — what the RL loop's paced admission reads to predict the step's end — and 0 once
    the step is over, so a pacer reading it at the next hand-over does not take the next step
    as finished."""
    trainer = RLTrainer(copy.deepcopy(tiny.model), RLConfig(micro_batch_tokens=64),
                        pad_token_id=tiny.tokenizer.pad_token_id)  # fmt: skip
    seen: list[float] = []
    backward = torch.Tensor.backward

    def spy(self, *a, **k):
        backward(self, *a, **k)
        seen.append(trainer.progress)  # before this micro-batch is counted

    monkeypatch.setattr(torch.Tensor, "backward", spy)
    trainer.step(fresh(sampled))
    assert len(seen) > 1 and seen[0] == 0.0
    assert seen == sorted(seen) and seen[-1] < 1.0
    assert trainer.progress == 0.0


@pytest.mark.parametrize("checkpointing", [False, True])
def test_weights_cast_once_per_step_gives_the_same_bf16_step(tiny, sampled, checkpointing):
    """Under bf16 autocast the trainer casts each weight once per optimizer step
    (``_weights_cast_once``: autocast's weight cache lives as long as the outermost
    context), not once per micro-batch. The cast is deterministic, so the step is the same
    one: identical gradients and weights after two optimizer steps (two minibatches, so the
    cache must also not outlive a step), with and without recomputed layers."""
    import contextlib

    pad = tiny.tokenizer.pad_token_id
    cfg = RLConfig(
        lr=1e-3,
        autocast="bfloat16",
        minibatches=2,
        packing="rows",
        micro_batch_tokens=64,
        gradient_checkpointing=checkpointing,
    )
    outs, micro = [], []
    for once in (True, False):
        m = copy.deepcopy(tiny.model)
        trainer = RLTrainer(m, cfg, pad_token_id=pad)
        if not once:  # the old way: a fresh autocast context (and cast) per micro-batch
            trainer._weights_cast_once = contextlib.nullcontext  # type: ignore[method-assign]
        loss = trainer._micro_loss

        def counted(*args, _loss=loss, _once=once, **kwargs):
            micro.append(_once)
            return _loss(*args, **kwargs)

        trainer._micro_loss = counted  # type: ignore[method-assign]
        result = trainer.step(fresh(sampled))
        assert result.metrics["optimizer_steps"] == 2
        outs.append(
            (
                torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None]),
                torch.cat([p.detach().flatten() for p in m.parameters()]),
                result.metrics["loss"],
            )
        )
    (g1, w1, l1), (g0, w0, l0) = outs
    assert micro.count(True) >= 4  # several micro-batches per optimizer step
    assert g1.abs().max() > 0
    assert torch.equal(g1, g0) and torch.equal(w1, w0) and l1 == l0
