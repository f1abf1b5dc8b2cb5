"""provrl TRPO vs sb3-contrib TRPO on classic control: `python benchmarks/trpo_vs_sb3.py --json`.

Both trainers run in this one process, single-threaded (torch.set_num_threads(1)), with the
same environment-step budget (100k), seed by seed and interleaved (the side that goes
first alternates), so machine load hits both alike. sb3-contrib uses the tuned
hyperparameters of rl-baselines3-zoo (hyperparams/trpo.yml), written out in SB3_ZOO below;
provrl uses its presets (provrl.classic.config.ENV_PRESETS).

Returns are deterministic-policy evaluation means over ``--eval-episodes`` (20) fresh seeded
episodes per trained agent (the same episodes for both sides, seed by seed) (provrl.classic.evaluate.run_episodes, the same protocol for
both), averaged over the seeds. Wall time is the training call (environment and model
construction included, evaluation excluded), median over the seeds (5); time_ratio =
provrl / sb3. An untimed 2k-step warm-up of both sides precedes each environment. Target: provrl_return ≥ sb3_return on every environment and time_ratio ≤ 0.5.

Prints ``{"envs": {"CartPole-v1": {"provrl_return": …, "sb3_return": …, "provrl_wall_s": …,
"sb3_wall_s": …, "time_ratio": …, …}, …}, …}``. ``--quick`` is a smoke run (10k steps,
one seed).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from typing import Any, cast

import numpy as np
import torch

from provrl.classic.config import config_for
from provrl.classic.evaluate import run_episodes
from provrl.classic.train import train

ENVS = ["CartPole-v1", "Acrobot-v1", "Pendulum-v1"]

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
    returns = run_episodes(result.actor(True), env_id, eval_episodes, seed=10_000 + 100 * seed)
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

    returns = run_episodes(act, env_id, eval_episodes, seed=10_000 + 100 * seed)
    env.close()
    return float(returns.mean()), wall


def run_benchmark(
    envs: list[str] = ENVS,
    steps: int = 100_000,
    seeds: int = 5,
    eval_episodes: int = 20,
    verbose: bool = True,
    first_seed: int = 0,
) -> dict[str, Any]:
    """Train both sides on every environment and seed, interleaved; return the JSON dict."""
    torch.set_num_threads(1)
    import sb3_contrib

    out: dict[str, Any] = {"envs": {}}
    for env_id in envs:
        # warm-up, untimed: first-call costs (imports, env registration, allocator) hit neither
        run_provrl(env_id, 2048, 0, 1)
        run_sb3(env_id, 2048, 0, 1)
        rows: dict[str, list[float]] = {k: [] for k in ("pr", "pw", "sr", "sw")}
        for seed in range(first_seed, first_seed + seeds):
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
        pw, sw = statistics.median(rows["pw"]), statistics.median(rows["sw"])
        pr, sr = float(np.mean(rows["pr"])), float(np.mean(rows["sr"]))
        out["envs"][env_id] = {
            "provrl_return": round(pr, 2),
            "sb3_return": round(sr, 2),
            "provrl_wall_s": round(pw, 2),
            "sb3_wall_s": round(sw, 2),
            "time_ratio": round(pw / sw, 3),
            "provrl_returns": [round(x, 2) for x in rows["pr"]],
            "sb3_returns": [round(x, 2) for x in rows["sr"]],
            "provrl_walls_s": [round(x, 2) for x in rows["pw"]],
            "sb3_walls_s": [round(x, 2) for x in rows["sw"]],
            "target_met": bool(pr >= sr and pw / sw <= 0.5),
        }
    out["target_met"] = all(e["target_met"] for e in out["envs"].values())
    out["setup"] = {
        "steps": steps,
        "seeds": list(range(first_seed, first_seed + seeds)),
        "eval_episodes": eval_episodes,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "sb3_contrib": sb3_contrib.__version__,
        "python": platform.python_version(),
        "wall": "median over seeds of the training call; time_ratio = provrl / sb3",
        "return": "mean over seeds of the deterministic-policy evaluation mean",
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--envs", nargs="+", default=ENVS, help="gymnasium env ids")
    ap.add_argument("--steps", type=int, default=100_000, help="environment steps per run")
    ap.add_argument("--seeds", type=int, default=5, help="number of seeds per environment")
    ap.add_argument("--first-seed", type=int, default=0, help="seeds first … first+n−1")
    ap.add_argument("--eval-episodes", type=int, default=20, help="evaluation episodes per agent")
    ap.add_argument("--quick", action="store_true", help="smoke run: 10k steps, one seed")
    ap.add_argument("--json", action="store_true", help="print JSON only (progress on stderr)")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.seeds, args.eval_episodes = 10_000, 1, 3
    result = run_benchmark(
        args.envs, args.steps, args.seeds, args.eval_episodes, first_seed=args.first_seed
    )
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
