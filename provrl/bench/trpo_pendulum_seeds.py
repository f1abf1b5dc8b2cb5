"""Why provrl TRPO on Pendulum-v1 varies across seeds: `python benchmarks/trpo_pendulum_seeds.py`.

Runs only on the Pendulum preset's *tuning* seeds (Preset.tuning_seeds, 10-40): this is the
diagnosis that chose the preset, so the held-out seeds of benchmarks/trpo_vs_sb3.py stay
untouched. For each seed it trains two variants for 100k steps, single-threaded, one after
the other:

* ``unbounded``: the preset with ``bounded_mean=False`` (μ(s) = f(s), the preset before
  issue 17),
* ``bounded``: the preset (μ(s) = 2·tanh(f(s))),

and records per seed and variant:

* ``ret20``: the deterministic-policy mean over 20 episodes with the seeds the benchmark used
  to draw for this training seed (10 000 + 100 s + i): the old protocol;
* ``ret200``: the same policy on 200 *common* episodes (seeds 900 000 + i, the same for every
  seed and variant), ``fail200``: how many of them end not upright (mean |θ| over the last
  50 steps > 0.5 rad), ``ret_by_start``: per-episode return and |θ₀| (for the plot);
* ``saturated``: the fraction of states visited in those episodes where the policy's sample
  clips to one bound with probability > 0.95 (P(a > 2) or P(a < −2) under N(μ, σ²)) —
  there every sample is the same action and the policy gradient vanishes;
* per iteration, averaged over the run: ``ev`` (explained variance of V(s) against the
  λ-returns, second half of the run), ``ev_mc`` (against the discounted reward-to-go),
  ``step_frac`` (accepted α^j), ``rejected`` (fraction of steps the line search rejected),
  ``kl_over_delta`` (accepted mean KL / δ); ``sigma`` (final σ), ``wall_s``.

Writes the JSON to ``--out`` (default runs/trpo_pendulum_seeds.json), prints a summary JSON
and draws ``--plot`` (default docs/img/trpo_pendulum_seeds.png).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from scipy.stats import norm

from provrl.classic.config import ENV_PRESETS, config_for
from provrl.classic.evaluate import run_episodes
from provrl.classic.policies import GaussianPolicy
from provrl.classic.train import TrainResult, train

ENV = "Pendulum-v1"
VARIANTS: dict[str, dict[str, Any]] = {"unbounded": {"bounded_mean": False}, "bounded": {}}
COMMON_SEED = 900_000


class Rows:
    """An in-memory metrics sink (the MetricsWriter interface train() logs to)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def log(self, step: int, row: dict[str, float]) -> None:
        self.rows.append(row)


def common_episodes(result: TrainResult, episodes: int) -> dict[str, Any]:
    """Deterministic episodes from the common initial states: returns, |θ₀|, failures and
    the saturated-state fraction (see the module docstring)."""
    act = result.actor(True)
    assert isinstance(result.policy, GaussianPolicy)
    sigma = float(torch.exp(result.policy.log_std.detach())[0])
    envs = gym.make_vec(ENV, num_envs=episodes, vectorization_mode="sync")
    obs, _ = envs.reset(seed=COMMON_SEED)
    theta0 = np.abs(np.arctan2(obs[:, 1], obs[:, 0]))
    ret = np.zeros(episodes)
    late_theta = np.zeros(episodes)
    saturated = 0
    for t in range(200):  # Pendulum-v1 episodes are exactly 200 steps
        mu = act(obs)[:, 0]
        p_high, p_low = norm.sf((2.0 - mu) / sigma), norm.cdf((-2.0 - mu) / sigma)
        saturated += int(((p_high > 0.95) | (p_low > 0.95)).sum())
        obs, r, _, _, _ = envs.step(np.clip(mu, -2.0, 2.0)[:, None])
        ret += r
        if t >= 150:
            late_theta += np.abs(np.arctan2(obs[:, 1], obs[:, 0])) / 50
    envs.close()
    return {
        "ret200": float(ret.mean()),
        "fail200": int((late_theta > 0.5).sum()),
        "saturated": saturated / (200 * episodes),
        "sigma": sigma,
        "ret_by_start": [
            [round(float(a), 3), round(float(b), 1)] for a, b in zip(theta0, ret, strict=True)
        ],
    }


def one_run(seed: int, variant: str, episodes: int, steps: int) -> dict[str, Any]:
    cfg = config_for(ENV, {**VARIANTS[variant], "seed": seed, "total_steps": steps})
    log = Rows()
    t0 = time.perf_counter()
    result = train(cfg, log=log)
    wall = time.perf_counter() - t0
    rows = log.rows
    accepted = [r for r in rows if r["trpo/accepted"]]
    row: dict[str, Any] = {
        "seed": seed,
        "variant": variant,
        "ret20": float(run_episodes(result.actor(True), ENV, 20, 10_000 + 100 * seed).mean()),
        **common_episodes(result, episodes),
        "ev": float(np.mean([r["value/explained_variance"] for r in rows[len(rows) // 2 :]])),
        "ev_mc": float(np.mean([r["value/explained_variance_mc"] for r in rows[len(rows) // 2 :]])),
        "step_frac": float(np.mean([r["trpo/step_frac"] for r in rows])),
        "rejected": 1 - len(accepted) / len(rows),
        "kl_over_delta": float(np.mean([r["trpo/kl"] for r in accepted]) / cfg.trpo.delta),
        "wall_s": wall,
    }
    return row


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in VARIANTS:
        rs = [r for r in runs if r["variant"] == v]
        r20 = np.array([r["ret20"] for r in rs])
        r200 = np.array([r["ret200"] for r in rs])
        out[v] = {
            "seeds": len(rs),
            "ret20_mean": round(float(r20.mean()), 1),
            "ret20_sd_over_seeds": round(float(r20.std(ddof=1)), 1),
            "ret200_mean": round(float(r200.mean()), 1),
            "ret200_sd_over_seeds": round(float(r200.std(ddof=1)), 1),
            "ret200_worst_seed": round(float(r200.min()), 1),
            "seeds_with_failures": [r["seed"] for r in rs if r["fail200"] > 0],
            "failed_episodes": int(sum(r["fail200"] for r in rs)),
            **{
                k: round(float(np.mean([r[k] for r in rs])), 4)
                for k in ("ev", "ev_mc", "step_frac", "rejected", "kl_over_delta", "sigma")
            },
            "saturated_mean": round(float(np.mean([r["saturated"] for r in rs])), 4),
            "wall_s_median": round(float(np.median([r["wall_s"] for r in rs])), 2),
        }
    return out


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {
        v: sorted((r for r in runs if r["variant"] == v), key=lambda r: r["seed"]) for v in VARIANTS
    }
    seeds = [r["seed"] for r in by["unbounded"]]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), dpi=110)
    ax = axes[0]
    first = (
        ("ret20", "o", "tab:gray", "20 episodes, seed's own starts (old protocol)"),
        ("ret200", "s", "tab:red", "200 common episodes"),
    )
    for key, marker, color, label in first:
        ax.plot(seeds, [r[key] for r in by["unbounded"]], marker, color=color, label=label)
    ax.set_title("unbounded mean: per-seed return")
    ax.set_xlabel("training seed (tuning seeds)")
    ax.set_ylabel("deterministic return")
    ax.legend(fontsize=7)
    ax = axes[1]
    for v, color in (("unbounded", "tab:red"), ("bounded", "tab:blue")):
        ax.plot(
            seeds,
            [r["ret200"] for r in by[v]],
            "s" if v == "unbounded" else "o",
            color=color,
            alpha=0.8,
            label=f"{v} (200 common episodes)",
        )
    ax.set_title("per-seed return, same 200 initial states")
    ax.set_xlabel("training seed (tuning seeds)")
    ax.legend(fontsize=7)
    worst = min(by["unbounded"], key=lambda r: r["ret200"])
    ax = axes[2]
    for v, color in (("unbounded", "tab:red"), ("bounded", "tab:blue")):
        r = next(x for x in by[v] if x["seed"] == worst["seed"])
        a = np.array(r["ret_by_start"])
        ax.plot(
            a[:, 0],
            a[:, 1],
            "." if v == "bounded" else "x",
            color=color,
            alpha=0.7,
            label=f"{v}: mean {r['ret200']:.0f}, {r['fail200']} not upright",
        )
    ax.set_title(f"seed {worst['seed']}: return by initial angle")
    ax.set_xlabel("|θ₀| (rad; π = hanging down)")
    ax.legend(fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    tuning = ENV_PRESETS[ENV].tuning_seeds
    ap.add_argument("--first-seed", type=int, default=tuning.start)
    ap.add_argument("--seeds", type=int, default=len(tuning))
    ap.add_argument("--steps", type=int, default=100_000, help="environment steps per run")
    ap.add_argument("--episodes", type=int, default=200, help="common evaluation episodes")
    ap.add_argument("--out", type=Path, default=Path("runs/trpo_pendulum_seeds.json"))
    ap.add_argument("--plot", type=Path, default=Path("docs/img/trpo_pendulum_seeds.png"))
    ap.add_argument("--json", action="store_true", help="(the summary is always JSON on stdout)")
    args = ap.parse_args(argv)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    outside = [s for s in seeds if s not in tuning]
    if outside:  # the diagnosis may look at tuning seeds only
        ap.exit(
            2,
            f"trpo_pendulum_seeds: seeds {outside} are not tuning seeds "
            f"({tuning.start}-{tuning.stop - 1}) of the {ENV} preset\n",
        )
    torch.set_num_threads(1)
    runs = []
    for seed in seeds:
        for v in VARIANTS:
            r = one_run(seed, v, args.episodes, args.steps)
            runs.append(r)
            print(
                f"seed {seed} {v:9s} ret20 {r['ret20']:7.1f} ret200 {r['ret200']:7.1f} "
                f"fail {r['fail200']:3d} sat {r['saturated']:.3f} ev {r['ev']:.3f} "
                f"ev_mc {r['ev_mc']:.3f} frac {r['step_frac']:.3f} wall {r['wall_s']:.1f}",
                file=sys.stderr,
                flush=True,
            )
    from provrl.bench.results import run_record, write_result

    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    record = {"runs": runs, "summary": summary(runs)}
    write_result(args.out, run_record("trpo_pendulum_seeds", record, config=config, seeds=seeds))
    plot(runs, args.plot)
    print(
        json.dumps(
            {"summary": summary(runs), "seeds": seeds, "out": str(args.out), "plot": str(args.plot)}
        )
    )


if __name__ == "__main__":
    main()
