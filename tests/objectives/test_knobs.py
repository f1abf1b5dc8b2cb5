"""The knobs a TRL / verl user reaches for: dual clip, entropy bonus (pure functions, hand
values), and their peer names in the config."""

from __future__ import annotations

import pytest
import torch

from provrl.objectives.config import AdvantageConfig, ObjectiveConfig
from provrl.objectives.losses import dual_clip, entropy_bonus, loss_token_weights, policy_loss
from provrl.train.logprobs import entropy_from_logits


def test_dual_clip_hand_values():
    o = torch.tensor([-5.0, -1.0, 2.0, -4.0])
    a = torch.tensor([-1.0, -1.0, 1.0, 2.0])
    out, active = dual_clip(o, a, 3.0)
    # A < 0: bounded below by c·A = −3 (the first); A ≥ 0: untouched even if o < c·A
    assert out.tolist() == [-3.0, -1.0, 2.0, -4.0]
    assert active.tolist() == [True, False, False, False]


def test_dual_clip_stops_the_gradient_of_an_exploded_negative_token():
    """r = e³ ≈ 20 with A = −1: PPO's pessimistic term is r·A = −20 (the clip only guards the
    other side), dual clip c = 3 bounds it at −3 and the token gets no gradient."""
    logp = torch.tensor([[0.0, 3.0, 0.1]], requires_grad=True)
    zeros = torch.zeros(1, 3)
    adv = torch.tensor([[0.0, -1.0, -1.0]])
    mask = torch.tensor([[False, True, True]])
    w = loss_token_weights(mask, "token_mean")
    base = dict(correction="on_policy", clip_eps_low=0.2, clip_eps_high=0.2)
    plain = policy_loss(logp, zeros, zeros, adv, mask, w, ObjectiveConfig(**base))
    dual = policy_loss(logp, zeros, zeros, adv, mask, w, ObjectiveConfig(**base, dual_clip=3.0))
    # ratio = exp(log π − log π_prox) with log π_prox = 0; the loss is −mean(surrogate)
    assert float(plain.loss.detach()) == pytest.approx(
        -(torch.e**3 * -1 + torch.e**0.1 * -1) / 2, rel=1e-5
    )
    assert float(dual.loss.detach()) == pytest.approx(-(-3.0 + torch.e**0.1 * -1) / 2, rel=1e-5)
    (g,) = torch.autograd.grad(dual.loss, logp)
    assert g[0, 1] == 0 and g[0, 2] != 0
    assert dual.num_clipped == 1 and plain.num_clipped == 0


def test_entropy_bonus_hand_value_and_it_raises_the_entropy():
    z = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 0.5]], requires_grad=True)
    h = entropy_from_logits(z)
    p = torch.softmax(z.detach(), -1)
    torch.testing.assert_close(h.detach(), -(p * p.log()).sum(-1))
    assert float(h[1]) == pytest.approx(torch.log(torch.tensor(3.0)).item())
    w = torch.tensor([0.25, 0.75])
    assert float(entropy_bonus(h, w)) == pytest.approx(float(0.25 * h[0] + 0.75 * h[1]))
    # through the policy loss: with A = 0 the loss is −c_H · H̄, so descent raises H
    logp = torch.log_softmax(z, -1)[:, 0][None]
    zeros, mask = torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool)
    cfg = ObjectiveConfig(correction="on_policy", entropy_coef=0.5)
    out = policy_loss(logp, zeros, zeros, zeros, mask, w[None], cfg, entropy=h[None])
    assert float(out.loss) == pytest.approx(-0.5 * out.entropy) and out.entropy > 0
    out.loss.backward()
    with torch.no_grad():
        z2 = z - 1.0 * z.grad
    assert entropy_from_logits(z2)[0] > h[0]
    with pytest.raises(ValueError, match="entropy_coef > 0 needs the entropy"):
        policy_loss(logp, zeros, zeros, zeros, mask, w[None], cfg)


def test_chunked_entropy_with_grad_equals_the_detached_one(tiny):
    from provrl.train.logprobs import token_logprobs_chunked

    ids = torch.tensor([[1, 500, 600, 700, 800, 900]])
    pos = torch.tensor([[False, False, True, True, False, True]])
    ref = token_logprobs_chunked(tiny.model, ids, positions=pos, with_entropy=True, chunk_tokens=2)
    out = token_logprobs_chunked(tiny.model, ids, positions=pos, entropy_grad=True, chunk_tokens=2)
    assert ref.entropy is not None and out.entropy is not None and out.entropy.requires_grad
    torch.testing.assert_close(out.entropy.detach(), ref.entropy, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.logprobs.detach(), ref.logprobs, atol=1e-5, rtol=0)
    out.entropy.sum().backward()
    assert tiny.model.model.embed_tokens.weight.grad is not None
    tiny.model.zero_grad(set_to_none=True)


# ----------------------------------------------------------------------------- names
def test_trl_and_verl_names_set_the_same_fields():
    o = ObjectiveConfig.model_validate(
        {"epsilon": 0.1, "epsilon_high": 0.3, "beta": 0.04, "loss_type": "dr_grpo",
         "norm_tokens": 512, "clip_ratio_c": 3.0, "entropy_coeff": 0.01}
    )  # fmt: skip
    assert (o.clip_eps_low, o.clip_eps_high, o.kl_coef) == (0.1, 0.3, 0.04)
    assert (o.aggregation, o.dual_clip, o.entropy_coef) == ("seq_sum_norm", 3.0, 0.01)
    v = ObjectiveConfig.model_validate(
        {"clip_ratio_low": 0.2, "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl",
         "loss_agg_mode": "seq-mean-token-mean"}
    )  # fmt: skip
    assert (v.clip_eps_low, v.kl_coef, v.kl_estimator) == (0.2, 0.001, "k3")
    assert v.aggregation == "seq_mean_token_mean"
    assert ObjectiveConfig(clip_eps_low=0.3).clip_eps_low == 0.3  # the provrl name still works
    assert ObjectiveConfig().model_dump()["clip_eps_low"] == 0.2  # and is what is written
    assert AdvantageConfig.model_validate({"scale_rewards": "none"}).std_normalise is False
    assert AdvantageConfig.model_validate({"norm_adv_by_std_in_grpo": False}).std_normalise is False
    with pytest.raises(ValueError, match="batch_norm='scale'"):
        AdvantageConfig.model_validate({"scale_rewards": "batch"})


def test_peer_names_reach_the_run_config_and_typos_get_a_suggestion():
    from provrl.config import ConfigError, load_config
    from provrl.run_config import RunConfig

    cfg = load_config(RunConfig, None, ["rl.num_iterations=2", "rl.learning_rate=3e-6",
                                        "rl.objective.beta=0.02", "rl.lr_scheduler_type=cosine",
                                        "rl.lr_decay_steps=100", "rl.mask_truncated_completions=true"])  # fmt: skip
    assert (cfg.rl.epochs, cfg.rl.lr, cfg.rl.objective.kl_coef) == (2, 3e-6, 0.02)
    assert cfg.rl.lr_schedule == "cosine" and cfg.rl.mask_truncated
    with pytest.raises(ConfigError, match=r"unknown key 'rl.objective.clip_eps_lo' \(did you mean 'rl.objective.clip_eps_low'\?\)"):  # fmt: skip
        load_config(RunConfig, None, ["rl.objective.clip_eps_lo=0.1"])
    with pytest.raises(ConfigError, match=r"unknown key 'rl.beta' \(did you mean 'rl.objective.beta'\?\)"):  # fmt: skip
        load_config(RunConfig, None, ["rl.beta=0.1"])
    with pytest.raises(ConfigError, match=r"'rl.objective.epsilon' \(it sets 'rl.objective.clip_eps_low', which is given twice\)"):  # fmt: skip
        load_config(RunConfig, None, ["rl.objective.epsilon=0.1", "rl.objective.clip_eps_low=0.2"])
    with pytest.raises(ConfigError, match=r"unknown key 'rl.zzz'$"):
        load_config(RunConfig, None, ["rl.zzz=1"])
