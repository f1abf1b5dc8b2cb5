"""The trainer's loss and gradient on stale, mixed-version data equal a hand computation
from the *recorded* behaviour probabilities — the property provrl is named for.

The batch: 3 tasks × 4 trajectories of two turns each. Turn 1 is sampled by a stale
snapshot at version 3, a tool result follows, turn 2 is sampled by version 4 (a hot-load
between the turns, the KV of turn 1 kept); the trainer is at version 5. The snapshots are
the tiny model's weights with seeded noise, so each token's behaviour probability q_{v_t}
is known exactly (the sampler records it after temperature and top-p, as the engine does);
one task is sampled under top-p 0.9, one at temperature 0.8. The hand computation is
written here from the formulas, with nothing from provrl's objectives: a plain
transformers forward per trajectory for log π, then, per action token,

    ρ_t = π_prox(a_t|h_t) / q_{v_t}(a_t|h_t)      (q: the recorded logprob, never recomputed)
    ℓ_t = −min(ρ_t, 2) · min(r_t A, clip(r_t, 1 − 0.2, 1 + 0.28) A),   r_t = π_θ/π_prox

averaged over each minibatch's action tokens (``tis`` cap 2 + PPO clip, the default
objective), the gradient clipped to norm 1 as the trainer does. π_θ is the *untruncated*
model (no top-p) at the row's temperature; π_prox is the weights before the update. The
trainer's gradients are read at each optimizer step, its loss and diagnostics from its
metrics. Four configurations: ``RLConfig()`` (one minibatch: π_prox is the training forward's
own), the default preset's two minibatches (the first reuses its forward, the second gets a
proximal pass and trains at moved weights), the same with ``packing: none``, and with
``proximal: pass``.

Mutations tried, each applied to ``provrl/train/rl.py`` by hand and reverted (at f147b92);
every one made all 4 cases fail, as it must:

1. *π_prox in place of the recorded q* — in ``RLTrainer._micro_loss`` the loss's ``logq``
   argument ``_cut(batch.tb.behaviour_logprobs, rows, L)`` replaced by
   ``_cut(prox.logprobs, rows, L)`` (every ρ_t becomes 1): the gradient is 0.52–0.57 off
   the hand computation (relative error; the tolerance is 2e-4).
2. *recomputed log-probs in place of the recorded q* — ``RLTrainer.step`` overwriting
   ``batch.tb.behaviour_logprobs`` with a teacher-forced pass of the current weights
   (``self.proximal_pass(batch).logprobs``): the same 0.52–0.57.
3. *the tokens' version shifted by one* — ``prepare_batch`` adding 1 to
   ``tb.versions`` on action tokens (and to the version ``kv_stale_frac`` compares with):
   ``lag_mean`` 0.5 against 1.5 by hand. The loss cannot see a version — each token's q
   is recorded with it — which is why this test checks the lag accounting too.
4. *q shifted by one token* (logprob[t] read from t−1, an alignment slip) —
   ``tb.behaviour_logprobs`` rolled by one position in ``prepare_batch``: the gradient is
   0.90–0.94 off.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from conftest import even_fraction, sample_tokens

from provrl.provenance import SamplingParams, Trajectory, TrajectoryBuilder
from provrl.train.config import RLConfig
from provrl.train.rl import RLTrainer

CURRENT = 5
"""The trainer's version; turn 1 was sampled at version 3 (lag 2), turn 2 at 4 (lag 1)."""
TURN_TOKENS = 5
CAP, EPS_LOW, EPS_HIGH, MAX_NORM = 2.0, 0.2, 0.28, 1.0
"""The default objective (``tis``, is_cap 2, clip 0.2 / 0.28) and gradient clip."""
SAMPLING = ((1.0, 1.0), (0.8, 1.0), (1.0, 0.9))
"""(temperature, top_p) of each task."""


def snapshot(model, seed: int, scale: float = 2.0):
    """``model``'s weights plus seeded noise: the stale version that sampled a turn."""
    m = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(scale * p.detach().abs().mean() * torch.randn(p.shape, generator=g))
    return m


@pytest.fixture(scope="module")
def stale_batch(tiny, prompts) -> list[Trajectory]:
    v3, v4 = snapshot(tiny.model, 3), snapshot(tiny.model, 4)
    tool = tiny.tokenizer.encode("\nresult: 42 documents\n", add_special_tokens=False)
    out: list[Trajectory] = []
    for j, ((task_id, ids), (temp, top_p)) in enumerate(zip(prompts, SAMPLING, strict=True)):
        g = torch.Generator().manual_seed(100 + j)
        n = 4
        x = torch.tensor([list(ids)] * n)
        kw = {"temperature": temp, "top_p": top_p, "generator": g}
        t1 = sample_tokens(v3, x, TURN_TOKENS, **kw)
        x = torch.cat([x, torch.stack(t1[0], 1), torch.tensor([tool] * n)], 1)
        t2 = sample_tokens(v4, x, TURN_TOKENS, **kw)
        params = SamplingParams(temperature=temp, top_p=top_p, max_new_tokens=TURN_TOKENS)
        for i in range(n):
            b = TrajectoryBuilder(f"{task_id}-{i}", task_id, sampling=params)
            b.add_prompt(list(ids))
            actions = []
            for turn, ((toks, logq, kept), v) in enumerate(((t1, 3), (t2, 4))):
                if turn:
                    b.add_observation(tool)
                    b.next_turn()
                a = [int(t[i]) for t in toks]
                actions += a
                b.add_actions(
                    a,
                    logprob=[float(lq[i]) for lq in logq],
                    kept_mass=[min(1.0, float(k[i])) for k in kept],
                    version=v,
                    kv_min=3,  # keep mode: turn 2 attends to turn 1's version-3 KV
                    kv_max=v,
                    replica=0,
                )
            out.append(b.build(reward=even_fraction(np.array(actions))))
    return out


# ----------------------------------------------------------------------------- by hand
def action_logprobs(model, traj: Trajectory) -> torch.Tensor:
    """log π(a_t|h_t) of ``traj``'s action tokens (float64, with grad): one plain forward,
    untruncated, at the trajectory's temperature."""
    ids = torch.tensor(traj.token_id, dtype=torch.long)[None]
    logits = model(input_ids=ids).logits[0, :-1].double() / traj.sampling.temperature
    lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
    return lp[torch.from_numpy(traj.is_action[1:])]


def advantages(trajs: list[Trajectory]) -> list[float]:
    """GRPO: (R − group mean) / (unbiased group std + 1e-6)."""
    out = []
    for t in trajs:
        r = np.array([u.reward for u in trajs if u.task_id == t.task_id], dtype=np.float64)
        out.append((t.reward - r.mean()) / (r.std(ddof=1) + 1e-6))
    return out


def recorded_logq(traj: Trajectory) -> torch.Tensor:
    return torch.from_numpy(traj.logprob[traj.is_action].astype(np.float64))


def hand_loss(model, trajs, rows, logprox, adv) -> torch.Tensor:
    """The minibatch loss of the module docstring (token mean over the rows' actions)."""
    terms = []
    for b in rows:
        lp, lprox, lq = action_logprobs(model, trajs[b]), logprox[b], recorded_logq(trajs[b])
        c = torch.exp(lprox - lq).clamp(max=CAP)
        r = torch.exp(lp - lprox)
        a = adv[b]
        terms.append(-c * torch.minimum(r * a, r.clamp(1 - EPS_LOW, 1 + EPS_HIGH) * a))
    return torch.cat(terms).mean()


def hand_gradient(model, params: dict[str, torch.Tensor], trajs, rows, logprox, adv):
    """(loss, gradient clipped to MAX_NORM) at ``params``."""
    m = copy.deepcopy(model)
    m.load_state_dict(params, strict=False)
    m.zero_grad(set_to_none=True)
    loss = hand_loss(m, trajs, rows, logprox, adv)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in m.named_parameters()}
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))
    coef = min(1.0, MAX_NORM / (norm + 1e-6))
    return float(loss.detach()), {n: g * coef for n, g in grads.items()}


def flat(d: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.reshape(-1).double() for _, v in sorted(d.items())])


PRESET = {"minibatches": 2, "micro_batch_size": 4, "lr": 3e-2}
"""The default preset's minibatches and micro-batches; a large lr so that the second step
trains at weights that moved (π_θ ≠ π_prox, the clip active)."""
CASES = {
    "RLConfig()": {},
    "preset: minibatches 2": PRESET,
    "minibatches 2, packing none": PRESET | {"packing": "none"},
    "minibatches 2, proximal pass": PRESET | {"proximal": "pass"},
}


@pytest.mark.parametrize("overrides", CASES.values(), ids=CASES.keys())
def test_loss_and_gradient_are_the_hand_computation_from_the_recorded_q(
    tiny, stale_batch, overrides
):
    cfg = RLConfig(**overrides)
    assert cfg.objective.correction == "tis" and cfg.objective.is_cap == CAP
    assert (cfg.objective.clip_eps_low, cfg.objective.clip_eps_high) == (EPS_LOW, EPS_HIGH)
    trajs = copy.deepcopy(stale_batch)
    model = copy.deepcopy(tiny.model)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        logprox = [action_logprobs(model, t) for t in trajs]
    adv = advantages(trajs)

    # the fixture can tell the right q from the wrong ones, by far more than the tolerance
    rho = torch.cat(
        [torch.exp(lp - recorded_logq(t)) for lp, t in zip(logprox, trajs, strict=True)]
    )
    assert float(rho.min()) < 0.5 and float(rho.max()) > CAP, "too little staleness"

    trainer = RLTrainer(model, cfg, pad_token_id=tiny.tokenizer.pad_token_id, version=CURRENT)
    seen: list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = []
    assert trainer.optimizer is not None
    step = trainer.optimizer.step

    def recording_step(*a, **k):
        named = list(model.named_parameters())
        seen.append(({n: p.detach().clone() for n, p in named},
                     {n: p.grad.detach().clone() for n, p in named}))  # fmt: skip
        return step(*a, **k)

    trainer.optimizer.step = recording_step  # type: ignore[method-assign]
    metrics = trainer.step(trajs).metrics

    # the minibatches the trainer documents: one seeded permutation, split in order
    order = torch.randperm(len(trajs), generator=torch.Generator().manual_seed(cfg.seed))
    minibatches = order.tensor_split(cfg.minibatches)
    assert len(seen) == len(minibatches)
    torch.testing.assert_close(seen[0][0], start, rtol=0, atol=0)  # step 1 at θ_prox
    losses = []
    for (params, grads), rows in zip(seen, minibatches, strict=True):
        loss, want = hand_gradient(tiny.model, params, trajs, rows.tolist(), logprox, adv)
        losses.append(loss)
        got, ref = flat(grads), flat(want)
        err = float((got - ref).norm() / ref.norm())
        assert err < 2e-4, f"gradient {err:.2e} off the hand computation from the recorded q"
    assert metrics["loss"] == pytest.approx(np.mean(losses), rel=1e-5, abs=1e-7)
    if cfg.minibatches > 1:  # the second step trained at moved weights, the clip active
        assert any(not torch.equal(seen[1][0][n], start[n]) for n in start)
        assert metrics["clip_frac"] > 0

    # diagnostics against the recorded q and the recorded versions
    lq = torch.cat([recorded_logq(t) for t in trajs])
    lprox = torch.cat(logprox)
    assert metrics["kl_q_pi_k1"] == pytest.approx(float((lq - lprox).mean()), abs=1e-5)
    assert metrics["weight_mean"] == pytest.approx(float(rho.clamp(max=CAP).mean()), rel=1e-4)
    lags = np.concatenate([CURRENT - t.version[t.is_action] for t in trajs])
    assert metrics["lag_mean"] == pytest.approx(lags.mean())  # 1.5: half lag 2, half lag 1
    assert metrics["lag_frac_1"] == metrics["lag_frac_2"] == 0.5 and metrics["lag_frac_0"] == 0
    assert metrics["kv_stale_frac"] == 0.5  # turn 2's tokens attended to version-3 KV
