"""provrl TRPO vs sb3-contrib TRPO on classic control: `python benchmarks/trpo_vs_sb3.py --json`.

Both trainers run in this one process, single-threaded (torch.set_num_threads(1)), with the
same environment-step budget (100k), seed by seed and interleaved (the side that goes
first alternates), so machine load hits both alike. sb3-contrib uses the tuned
hyperparameters of rl-baselines3-zoo (hyperparams/trpo.yml), written out in SB3_ZOO below;
provrl uses its presets (provrl.classic.config.ENV_PRESETS).

Seeds: ``--seeds`` (10) training seeds from ``--first-seed`` (101). Every preset declares the
seeds it was tuned on (``Preset.tuning_seeds``); the benchmark refuses to run on them. Seeds
of an earlier reported run (``provrl.classic.config.SEEN_SEEDS``, 41-50) may be rerun, but
only *fresh* seeds — never tuned on, never looked at — can meet the target.

Returns: for each agent, the deterministic-policy mean over ``--eval-episodes`` (100) fresh
episodes, environment i of training seed s reset with seed 10 000 + 100 s + i — the same
initial states for both sides, seed by seed (provrl.classic.evaluate.run_episodes). Per env
the JSON has these per-seed returns, their mean over seeds with a 95 % BCa bootstrap
interval over seeds (provrl.classic.evaluate.mean_ci) for both sides, and the same for the
paired per-seed difference provrl − sb3. Wall time is the training call (environment and
model construction included, evaluation excluded), median over the seeds; time_ratio =
provrl / sb3. An untimed 2k-step warm-up of both sides precedes each environment.

Verdict, per environment (:func:`verdict`): **ahead** when the paired difference's interval
lies above 0 (diff_ci[0] > 0), **behind** when it lies below 0, else **at par** — one side's
interval against the other's mean is not a comparison. Where an environment caps the return
(CartPole: 500) the JSON counts the seeds at the cap: a side at the cap on every seed has a
degenerate interval, and "ahead" then says only that the other side fell short of the cap.
Target, per environment: at least 10 fresh seeds, verdict ahead and time_ratio ≤ 0.5;
``target_met`` requires it for every environment. ``--quick`` is a smoke run (10k steps, one
seed, 3 episodes: no claim).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from provrl.classic.config import ENV_PRESETS, check_held_out, config_for, fresh_seeds
from provrl.classic.evaluate import mean_ci, run_episodes
from provrl.classic.train import train
from provrl.config import ConfigError

ENVS = ["CartPole-v1", "Acrobot-v1", "Pendulum-v1"]
MIN_SEEDS = 10  # fewer seeds: the JSON is reported, but target_met is False (no claim)
EVAL_SEED_STRIDE = 100  # evaluation seeds of training seed s: 10 000 + 100 s + i, i < 100
RETURN_CAP = {"CartPole-v1": 500.0}
"""Environments whose return has a ceiling (CartPole: 500 steps of reward 1)."""

# rl-baselines3-zoo hyperparams/trpo.yml (DLR-RM/rl-baselines3-zoo), "# Tuned" entries.
# n_timesteps is 1e5 for all three; `normalize: true` means VecNormalize (obs + reward).
SB3_ZOO: dict[str, dict[str, Any]] = {
    "CartPole-v1": {
        "n_envs": 2,
        "normalize": False,
        "kwargs": {
            "n_steps": 512,
            "batch_size": 512,
            "cg_damping": 1e-3,
            "gae_lambda": 0.98,
            "gamma": 0.99,
            "learning_rate": 1e-3,
            "n_critic_updates": 20,
        },
    },
    "Acrobot-v1": {"n_envs": 2, "normalize": True, "kwargs": {"n_steps": 1024}},
    "Pendulum-v1": {
        "n_envs": 2,
        "normalize": False,
        "kwargs": {
            "n_steps": 1024,
            "gamma": 0.9,
            "n_critic_updates": 15,
            "use_sde": True,
            "sde_sample_freq": 4,
        },
    },
}


def run_provrl(env_id: str, steps: int, seed: int, eval_episodes: int) -> tuple[float, float]:
    """(deterministic evaluation mean return, training wall seconds)."""
    t0 = time.perf_counter()
    result = train(config_for(env_id, {"total_steps": steps, "seed": seed}))
    wall = time.perf_counter() - t0
    returns = run_episodes(result.actor(True), env_id, eval_episodes, seed=eval_seed(seed))
    return float(returns.mean()), wall


def run_sb3(env_id: str, steps: int, seed: int, eval_episodes: int) -> tuple[float, float]:
    """(deterministic evaluation mean return, training wall seconds) for sb3-contrib TRPO."""
    from sb3_contrib import TRPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    zoo = SB3_ZOO[env_id]
    t0 = time.perf_counter()
    env = make_vec_env(env_id, n_envs=zoo["n_envs"], seed=seed)
    if zoo["normalize"]:
        env = VecNormalize(env, gamma=zoo["kwargs"].get("gamma", 0.99))
    model = TRPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **zoo["kwargs"])
    model.learn(total_timesteps=steps)
    wall = time.perf_counter() - t0

    vecnorm = env if isinstance(env, VecNormalize) else None
    if vecnorm is not None:
        vecnorm.training = False

    def act(obs: np.ndarray) -> np.ndarray:
        x = cast(np.ndarray, vecnorm.normalize_obs(obs)) if vecnorm is not None else obs
        action, _ = model.predict(x, deterministic=True)
        return action

    returns = run_episodes(act, env_id, eval_episodes, seed=eval_seed(seed))
    env.close()
    return float(returns.mean()), wall


def eval_seed(seed: int) -> int:
    """First evaluation-episode seed of training seed ``seed`` (the same for both sides)."""
    return 10_000 + EVAL_SEED_STRIDE * seed


def verdict(diff_ci: list[float] | None) -> str:
    """ "ahead" if the paired difference's interval lies above 0, "behind" if below, else
    "at par" (also without an interval: one seed proves nothing)."""
    if diff_ci is None:
        return "at par"
    if diff_ci[0] > 0:
        return "ahead"
    return "behind" if diff_ci[1] < 0 else "at par"


def compare(
    p_returns: list[float],
    s_returns: list[float],
    p_walls: list[float],
    s_walls: list[float],
    *,
    fresh: bool = True,
    cap: float | None = None,
) -> dict[str, Any]:
    """The per-environment JSON: per-seed values, means with 95 % bootstrap intervals,
    the paired difference and its verdict, median walls, time_ratio and target_met
    (``fresh``: the seeds were never looked at; ``cap``: the environment's return ceiling)."""
    n = len(p_returns)
    pw, sw = statistics.median(p_walls), statistics.median(s_walls)
    diff = [p - s for p, s in zip(p_returns, s_returns, strict=True)]

    def stats(x: list[float]) -> tuple[float, list[float] | None]:  # one seed: no interval
        if len(x) < 2:
            return round(x[0], 2), None
        m, lo, hi = mean_ci(x)
        return round(m, 2), [round(lo, 2), round(hi, 2)]

    (pm, p_ci), (sm, s_ci), (dm, d_ci) = stats(p_returns), stats(s_returns), stats(diff)
    r = lambda x: round(x, 2)  # noqa: E731
    v = verdict(d_ci)
    at_cap = {} if cap is None else {
        "return_cap": cap,
        "provrl_seeds_at_cap": sum(x >= cap for x in p_returns),
        "sb3_seeds_at_cap": sum(x >= cap for x in s_returns),
    }  # fmt: skip
    return {
        "provrl_return": pm,
        "provrl_ci": p_ci,
        "sb3_return": sm,
        "sb3_ci": s_ci,
        "diff_return": dm,
        "diff_ci": d_ci,
        "provrl_wall_s": r(pw),
        "sb3_wall_s": r(sw),
        "time_ratio": round(pw / sw, 3),
        "provrl_returns": [r(x) for x in p_returns],
        "sb3_returns": [r(x) for x in s_returns],
        "provrl_walls_s": [r(x) for x in p_walls],
        "sb3_walls_s": [r(x) for x in s_walls],
        "verdict": v,
        **at_cap,
        "fresh_seeds": fresh,
        "target_met": bool(n >= MIN_SEEDS and fresh and v == "ahead" and pw / sw <= 0.5),
    }


def run_benchmark(
    envs: list[str] = ENVS,
    steps: int = 100_000,
    seeds: int = 10,
    eval_episodes: int = 100,
    verbose: bool = True,
    first_seed: int = 101,
) -> dict[str, Any]:
    """Train both sides on every environment and seed, interleaved; return the JSON dict."""
    seed_list = list(range(first_seed, first_seed + seeds))
    for env_id in envs:  # before any training: a tuning seed is an error, not a footnote
        check_held_out(env_id, seed_list)
    if not 1 <= eval_episodes <= EVAL_SEED_STRIDE:
        raise ValueError(f"--eval-episodes {eval_episodes}: must be in 1..{EVAL_SEED_STRIDE}")
    torch.set_num_threads(1)
    import sb3_contrib

    out: dict[str, Any] = {"envs": {}}
    for env_id in envs:
        # warm-up, untimed: first-call costs (imports, env registration, allocator) hit neither
        run_provrl(env_id, 2048, 0, 1)
        run_sb3(env_id, 2048, 0, 1)
        rows: dict[str, list[float]] = {k: [] for k in ("pr", "pw", "sr", "sw")}
        for seed in seed_list:
            sides = [("p", run_provrl), ("s", run_sb3)]
            if seed % 2 == 1:  # alternate who goes first
                sides.reverse()
            for tag, fn in sides:
                ret, wall = fn(env_id, steps, seed, eval_episodes)
                rows[tag + "r"].append(ret)
                rows[tag + "w"].append(wall)
                if verbose:
                    name = "provrl" if tag == "p" else "sb3"
                    print(
                        f"{env_id} seed {seed} {name:6s} return {ret:8.1f}  wall {wall:6.1f}s",
                        file=sys.stderr,
                        flush=True,
                    )
        out["envs"][env_id] = compare(
            rows["pr"], rows["sr"], rows["pw"], rows["sw"],
            fresh=fresh_seeds(env_id, seed_list), cap=RETURN_CAP.get(env_id),
        )  # fmt: skip
    out["target_met"] = all(e["target_met"] for e in out["envs"].values())
    out["setup"] = {
        "steps": steps,
        "seeds": seed_list,
        "tuning_seeds": {
            e: [r.start, r.stop - 1]
            for e, p in ENV_PRESETS.items()
            if e in envs
            for r in [p.tuning_seeds]
        },
        "eval_episodes": eval_episodes,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "sb3_contrib": sb3_contrib.__version__,
        "python": platform.python_version(),
        "wall": "median over seeds of the training call; time_ratio = provrl / sb3",
        "return": "per seed: deterministic-policy mean over eval_episodes episodes (same "
        "initial states for both sides); *_return: mean over seeds; *_ci: 95 % BCa bootstrap "
        "interval over seeds; diff = provrl - sb3, paired by seed",
        "verdict": "ahead: diff_ci above 0; behind: below 0; else at par",
        "target": f"per env: >= {MIN_SEEDS} fresh seeds, verdict ahead, time_ratio <= 0.5",
    }
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--envs", nargs="+", default=ENVS, help="gymnasium env ids")
    ap.add_argument("--steps", type=int, default=100_000, help="environment steps per run")
    ap.add_argument("--seeds", type=int, default=10, help="number of seeds per environment")
    ap.add_argument(
        "--first-seed", type=int, default=101, help="seeds first … first+n−1 (held out, fresh)"
    )
    ap.add_argument(
        "--eval-episodes", type=int, default=100, help="evaluation episodes per agent (≤ 100)"
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: 10k steps, one seed")
    ap.add_argument("--json", action="store_true", help="print JSON only (progress on stderr)")
    ap.add_argument("--out", type=Path, default=None, help="also write a results file here")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.seeds, args.eval_episodes = 10_000, 1, 3
    try:
        result = run_benchmark(
            args.envs, args.steps, args.seeds, args.eval_episodes, first_seed=args.first_seed
        )
    except (ConfigError, ValueError) as e:
        ap.exit(2, f"trpo_vs_sb3: {e}\n")
    if args.out is not None:
        from provrl.bench.results import run_record, write_result

        config = {k: v for k, v in vars(args).items() if k not in ("json", "out")}
        seeds = result["setup"]["seeds"]
        write_result(args.out, run_record("trpo_vs_sb3", result, config=config, seeds=seeds))
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
