"""TRPO on gymnasium control, readable top to bottom (in the spirit of CleanRL/Spinning Up).

One iteration::

    1. rollout    N environments × T steps with π_θ_old (observation statistics frozen)
    2. GAE        V(s), V(s') in one batched pass; Â, R̂ = GAE(γ, λ)      (classic/gae.py)
    3. policy     one trpo_step on  L(θ) = mean(π_θ(a|s)/π_θ_old(a|s) · Â)
                  s.t. mean KL(π_θ_old ‖ π_θ) ≤ δ                        (objectives/trpo.py)
    4. value      Adam on mean (V_φ(s) − R̂)² for vf_epochs × vf_minibatches
    5. stats      merge this rollout's observations into the running mean/variance

The TRPO step is the same function the LLM trainer calls; only the closures differ.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from torch import nn

from provrl.classic.config import ClassicTRPOConfig
from provrl.classic.evaluate import Act, run_episodes
from provrl.classic.gae import gae
from provrl.classic.normalize import RunningMeanStd
from provrl.classic.policies import Policy, make_policy, make_value_function
from provrl.config import ConfigError
from provrl.objectives.config import TRPOConfig
from provrl.objectives.trpo import TRPOStepInfo, subsample_index, trpo_step


@dataclass
class TrainResult:
    """A trained agent and its learning curve."""

    cfg: ClassicTRPOConfig
    policy: Policy
    value_fn: nn.Module
    obs_rms: RunningMeanStd | None
    steps: int
    wall_s: float
    curve_steps: list[int] = field(default_factory=list)  # env step at each iteration end
    curve_returns: list[float] = field(default_factory=list)  # mean return of episodes ended

    def actor(self, deterministic: bool = True) -> Act:
        return make_actor(self.policy, self.obs_rms, deterministic)


def make_actor(policy: Policy, obs_rms: RunningMeanStd | None, deterministic: bool = True) -> Act:
    """raw observations ``[B, obs_dim]`` → actions (the mode of π when deterministic)."""

    def act(obs: np.ndarray) -> np.ndarray:
        x = obs_rms.normalize(obs) if obs_rms is not None else obs.astype(np.float32)
        with torch.no_grad():
            d = policy(torch.from_numpy(x))
            a = policy.mode(d) if deterministic else policy.sample(d)
        return a.numpy()

    return act


def evaluate(result: TrainResult, episodes: int = 10, seed: int = 10_000) -> np.ndarray:
    """Returns of ``episodes`` deterministic-policy episodes (classic/evaluate.py)."""
    return run_episodes(result.actor(True), result.cfg.env_id, episodes, seed)


def explained_variance(pred: np.ndarray, target: np.ndarray) -> float:
    """1 − Var[target − pred] / Var[target] (1 = perfect value function, ≤ 0 = useless)."""
    var = float(np.var(target))
    return float("nan") if var == 0 else 1.0 - float(np.var(target - pred)) / var


def train(
    cfg: ClassicTRPOConfig,
    *,
    log: Any = None,
    progress: bool = False,
) -> TrainResult:
    """Train TRPO on ``cfg.env_id`` for ``cfg.total_steps`` environment steps.

    ``log`` is an optional :class:`provrl.report.MetricsWriter` (one row per iteration);
    ``progress`` shows a tqdm bar over environment steps.
    """
    t_start = time.perf_counter()
    # ---- seeding, done once and visibly
    torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)

    # ---- environments: N copies; SAME_STEP autoreset returns the reset observation at once
    #      and the true last observation in info["final_obs"]
    try:
        envs = gym.make_vec(
            cfg.env_id,
            num_envs=cfg.num_envs,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
        )
    except gym.error.Error as e:
        raise ConfigError(f"env_id {cfg.env_id!r}: {e}") from None
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    policy = make_policy(
        obs_space, act_space, cfg.hidden, cfg.activation, cfg.log_std_init, cfg.bounded_mean
    )
    obs_dim = policy_obs_dim(obs_space)
    value_fn = make_value_function(obs_dim, cfg.vf_hidden, cfg.activation)
    vf_opt = adam(list(value_fn.parameters()), cfg.vf_lr)
    obs_rms = RunningMeanStd(obs_dim) if cfg.normalize_obs else None
    ret_rms = RunningMeanStd(1) if cfg.normalize_rewards else None
    disc_ret = np.zeros(cfg.num_envs)  # running discounted return y ← γ y + r, for ret_rms
    continuous = isinstance(act_space, gym.spaces.Box)
    low = np.asarray(getattr(act_space, "low", 0.0))
    high = np.asarray(getattr(act_space, "high", 0.0))

    N, T = cfg.num_envs, cfg.num_steps
    act_shape: tuple[int, ...] = tuple(act_space.shape or ()) if continuous else ()
    obs_buf = np.zeros((T, N, obs_dim), np.float32)  # normalised, as the policy saw them
    next_buf = np.zeros((T, N, obs_dim), np.float32)  # true next observation (normalised)
    raw_buf = np.zeros((T, N, obs_dim), np.float32)  # raw, for the running statistics
    act_buf = np.zeros((T, N, *act_shape), np.float32 if continuous else np.int64)
    rew_buf = np.zeros((T, N), np.float32)
    disc_buf = np.zeros((T, N), np.float32)
    term_buf = np.zeros((T, N), bool)
    done_buf = np.zeros((T, N), bool)

    def norm(x: np.ndarray) -> np.ndarray:
        return obs_rms.normalize(x) if obs_rms is not None else x.astype(np.float32)

    obs, _ = envs.reset(seed=cfg.seed)
    ep_ret, ep_len = np.zeros(N), np.zeros(N, dtype=np.int64)
    result = TrainResult(cfg, policy, value_fn, obs_rms, 0, 0.0)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.total_steps, desc=f"trpo {cfg.env_id}", unit="step")

    step, iteration = 0, 0
    while step < cfg.total_steps:
        # ---- 1. rollout with π_θ_old
        finished: list[float] = []
        finished_len: list[int] = []
        for t in range(T):
            o = norm(obs)
            obs_buf[t], raw_buf[t] = o, obs
            with torch.no_grad():
                a = policy.sample(policy(torch.from_numpy(o)), gen).numpy()
            act_buf[t] = a
            env_a = np.clip(a, low, high) if continuous else a
            obs, reward, term, trunc, info = envs.step(env_a)
            done = term | trunc
            true_next = obs
            if done.any():
                true_next = obs.copy()
                for i in np.flatnonzero(done):
                    true_next[i] = info["final_obs"][i]
            next_buf[t] = norm(true_next)
            rew_buf[t], term_buf[t], done_buf[t] = reward, term, done
            ep_ret += reward
            disc_ret = cfg.gamma * disc_ret + reward
            disc_buf[t] = disc_ret
            disc_ret[done] = 0.0
            ep_len += 1
            for i in np.flatnonzero(done):
                finished.append(float(ep_ret[i]))
                finished_len.append(int(ep_len[i]))
                ep_ret[i], ep_len[i] = 0.0, 0
        step += N * T
        iteration += 1

        # ---- 2. advantages: GAE(γ, λ) with V(s) and V(s') in one pass each
        with torch.no_grad():
            v = value_fn(torch.from_numpy(obs_buf)).squeeze(-1).numpy()
            v_next = value_fn(torch.from_numpy(next_buf)).squeeze(-1).numpy()
        rewards = rew_buf
        if ret_rms is not None:  # r / std(discounted return), as VecNormalize does
            ret_rms.update(disc_buf.reshape(-1, 1))
            rewards = rew_buf / np.sqrt(ret_rms.var[0] + 1e-8).astype(np.float32)
        adv, ret = gae(rewards, v, v_next, term_buf, done_buf, cfg.gamma, cfg.gae_lambda)

        # ---- 3. policy: one TRPO step on the whole batch
        s = torch.from_numpy(obs_buf.reshape(N * T, obs_dim))
        a_t = torch.from_numpy(act_buf.reshape(N * T, *act_shape))
        A = torch.from_numpy(adv.reshape(-1))
        if cfg.normalize_advantages:
            A = (A - A.mean()) / (A.std() + 1e-8)
        info_step, entropy = policy_step(policy, s, a_t, A, cfg.trpo, gen)

        # ---- 4. value function: regress V_φ(s) on the λ-returns R̂
        vf_loss = fit_value(value_fn, vf_opt, s, torch.from_numpy(ret.reshape(-1)), cfg, gen)

        # ---- 5. observation statistics (after the update: the batch stays consistent)
        if obs_rms is not None:
            obs_rms.update(raw_buf)

        # ---- bookkeeping
        if finished:
            result.curve_steps.append(step)
            result.curve_returns.append(float(np.mean(finished)))
        if log is not None:
            row = {f"trpo/{k}": float(v) for k, v in info_step.as_dict().items()}
            row.update(
                {
                    "rollout/episode_return": mean_or_nan(finished),
                    "rollout/episode_length": mean_or_nan(finished_len),
                    "rollout/episodes": len(finished),
                    "policy/entropy": entropy,
                    "value/loss": vf_loss,
                    "value/explained_variance": explained_variance(v.reshape(-1), ret.reshape(-1)),
                    # against the discounted reward-to-go (λ = 1; bootstrapped only where the
                    # rollout or a time limit cuts it): no V inside the target
                    "value/explained_variance_mc": explained_variance(
                        v.reshape(-1),
                        gae(rewards, v, v_next, term_buf, done_buf, cfg.gamma, 1.0)[1].reshape(-1),
                    ),
                    "time/wall_s": time.perf_counter() - t_start,
                    "time/steps_per_s": step / (time.perf_counter() - t_start),
                }
            )
            log.log(step, row)
        if bar is not None:
            bar.update(N * T)
            if finished:
                bar.set_postfix(ret=f"{np.mean(finished):.1f}", kl=f"{info_step.kl:.4f}")

    envs.close()
    if bar is not None:
        bar.close()
    result.steps, result.wall_s = step, time.perf_counter() - t_start
    return result


def policy_step(
    policy: Policy,
    s: torch.Tensor,
    a: torch.Tensor,
    A: torch.Tensor,
    cfg: TRPOConfig,
    gen: torch.Generator,
) -> tuple[TRPOStepInfo, float]:
    """One TRPO step on a batch (states s, actions a, advantages Â) sampled from π_θ_old.

    The closures re-run the policy with its current parameters::

        L(θ)     = mean_i  π_θ(a_i|s_i) / π_θ_old(a_i|s_i) · Â_i
        D̄_KL(θ) = mean_i  KL(π_θ_old(·|s_i) ‖ π_θ(·|s_i))

    Returns the step's info and the entropy of π_θ_old (a diagnostic)."""
    with torch.no_grad():
        d_old = policy(s)
        logp_old = policy.log_prob(d_old, a)
        entropy = float(policy.entropy(d_old).mean())

    def surrogate() -> torch.Tensor:
        return (torch.exp(policy.log_prob(policy(s), a) - logp_old) * A).mean()

    def mean_kl() -> torch.Tensor:
        return policy.kl(d_old, policy(s)).mean()

    fvp_kl: Callable[[], torch.Tensor] | None = None
    if cfg.fvp_subsample < 1:  # the Fisher from a random fraction of the states
        idx = subsample_index(s.shape[0], cfg.fvp_subsample, gen)
        s_sub, d_sub = s[idx], d_old[idx]

        def subsample_kl() -> torch.Tensor:
            return policy.kl(d_sub, policy(s_sub)).mean()

        fvp_kl = subsample_kl

    info = trpo_step(list(policy.parameters()), surrogate, mean_kl, cfg, fvp_kl=fvp_kl)
    return info, entropy


def fit_value(
    value_fn: nn.Module,
    opt: torch.optim.Optimizer,
    s: torch.Tensor,
    targets: torch.Tensor,
    cfg: ClassicTRPOConfig,
    gen: torch.Generator,
) -> float:
    """Minimise mean (V_φ(s) − R̂)² by Adam over shuffled minibatches; mean loss."""
    n = s.shape[0]
    mb = max(1, n // cfg.vf_minibatches)
    losses = []
    for _ in range(cfg.vf_epochs):
        perm = torch.randperm(n, generator=gen)
        for k in range(0, n, mb):
            j = perm[k : k + mb]
            loss = (value_fn(s[j]).squeeze(-1) - targets[j]).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    return float(np.mean(losses)) if losses else float("nan")


def adam(params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """Adam, fused into one kernel where this torch build supports it (2× faster here)."""
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr)


def mean_or_nan(x: list[float] | list[int]) -> float:
    return float(np.mean(x)) if x else float("nan")


def policy_obs_dim(space: gym.Space) -> int:
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise ValueError(f"observation space {space}: expected a flat Box")
    return int(space.shape[0])


def save_agent(result: TrainResult, path: str | Path) -> None:
    """Policy, value function, observation statistics and config in one torch file."""
    torch.save(
        {
            "config": result.cfg.model_dump(mode="json"),
            "policy": result.policy.state_dict(),
            "value_fn": result.value_fn.state_dict(),
            "obs_rms": result.obs_rms.state_dict() if result.obs_rms is not None else None,
        },
        path,
    )
