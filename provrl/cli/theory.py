"""`provrl theory …` — exact TRPO quantities on tabular MDPs (issue 6).

Subcommands: ``bound`` (Theorem 1 on many exact cases), ``mm`` (Algorithm 1, average-KL TRPO,
policy iteration), ``mixed`` (mixed-version importance sampling), ``filtering`` (probe-k
retention), ``all`` (everything, optionally copying the figures into docs/img/). Each writes
``<out>/<name>.json`` and ``<out>/theory_<name>.png``; ``--json`` prints the JSON only.

Settings are the ``theory`` section of the run config (:class:`provrl.theory.config.
TheoryConfig`): ``--config FILE``, ``--set theory.mm.gamma=0.95``, or the flags generated
from its fields (:mod:`provrl.cli.options`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from provrl.cli.options import config_options
from provrl.run_config.run import RunConfig

app = typer.Typer(
    help="Exact TRPO theory on tabular MDPs: bounds, MM iteration, mixed-version IS.",
    no_args_is_help=True,
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON only.")]
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
MM_FLAGS = ("mdp", "states", "actions", "gamma", "iters", "deltas", "c_scales", "seed")
MIXED_FLAGS = ("vocab", "length", "eta", "target_version", "top_p", "kv_mix", "seed")
FILTERING_FLAGS = ("ks", "a", "b", "mc_samples", "seed")


@contextmanager
def _bad_parameter() -> Iterator[None]:
    """A ValueError from the maths (an impossible MDP or model size) is a bad option."""
    try:
        yield
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def _emit(result: dict[str, Any], out: Path, name: str, as_json: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2))
    if as_json:
        typer.echo(json.dumps(result))


def _bound(cfg: Any, out: Path, as_json: bool, progress: bool) -> None:
    from provrl.theory.bound_check import check_bounds
    from provrl.theory.plots import plot_bound

    res = check_bounds(cfg, progress=progress)
    res.summary["plot"] = str(plot_bound(res, out / "theory_bound.png"))
    _emit(res.summary, out, "bound", as_json)
    if not as_json:
        s = res.summary
        typer.echo(f"violations: {s['violations']}  {s['violations_by_check']}")
        typer.echo(f"pairs: {s['pairs']} on {s['mdps']} MDPs in {s['runtime_s']} s")
        typer.echo(f"identity max |error|: {s['identity_max_abs_error']:.3g}")
        for k, q in s["tightness"].items():
            typer.echo(f"tightness {k:9s} " + "  ".join(f"{a}={b:.3g}" for a, b in q.items()))
        typer.echo(f"misreadings (not bounds): {s['misreading_violations']}")
        typer.echo(f"plot: {s['plot']}")
    if res.summary["violations"]:
        raise typer.Exit(1)


B = "theory.bound."


@app.command("bound")
@config_options(
    {
        "mdps": B + "mdps",
        "pairs_per_family": B + "pairs_per_family",
        "search_steps": B + "search_steps",
        "seed": B + "seed",
        "out": "theory.out",
    }
)
def bound(
    cfg: RunConfig,
    as_json: JsonOpt = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on stderr.")] = True,
) -> None:
    """Check J(π')−J(π) = Σ ρ_π' Ā (to 1e-9) and both TRPO bounds on random and adversarial
    policy pairs; report violations, tightness quantiles and the gap-vs-α plot."""
    _bound(cfg.theory.bound, Path(cfg.theory.out), as_json, progress)


def _mm(cfg: Any, out: Path, as_json: bool) -> None:
    from provrl.report.metrics import MetricsWriter
    from provrl.theory.mm import make_mdp, mm_report
    from provrl.theory.plots import plot_mm

    with _bad_parameter():
        m = make_mdp(cfg.mdp, cfg.states, cfg.actions, cfg.gamma, cfg.seed)
    summary, traces, J_star = mm_report(m, cfg.iters, cfg.deltas, cfg.c_scales)
    writer = MetricsWriter(out / "mm", tensorboard=False)
    for i in range(cfg.iters + 1):
        writer.log(i, {tr.method: tr.J[i] for tr in traces}, prefix="J")
    writer.close()
    summary["plot"] = str(
        plot_mm(traces, J_star, f"{m.name}, γ = {m.gamma:g}", out / "theory_mm.png")
    )
    summary["config"] = cfg.model_dump()
    _emit(summary, out, "mm", as_json)
    if not as_json:
        typer.echo(f"{m.name} γ={m.gamma:g}  J* = {J_star:.6g}  J(π₀) = {summary['J_initial']:.6g}")
        for r in summary["runs"]:
            typer.echo(
                f"  {r['method']:22s} J_final={r['J_final']:.6g}  gap={r['gap_to_optimum']:.3g}  "
                f"monotone={r['monotone']}  min ΔJ={r['min_improvement']:.3g}"
            )
        typer.echo(f"plot: {summary['plot']}")


@app.command("mm")
@config_options({n: f"theory.mm.{n}" for n in MM_FLAGS} | {"out": "theory.out"})
def mm(cfg: RunConfig, as_json: JsonOpt = False) -> None:
    """Exact Algorithm 1 (max L − C·D_KL^max), average-KL TRPO for several δ and policy
    iteration (δ → ∞) from the uniform policy; plot J over iterations."""
    _mm(cfg.theory.mm, Path(cfg.theory.out), as_json)


def _mixed(cfg: Any, out: Path, as_json: bool) -> None:
    from provrl.theory.mixed import mixed_version_report
    from provrl.theory.plots import plot_mixed

    with _bad_parameter():
        rep = mixed_version_report(
            vocab=cfg.vocab,
            length=cfg.length,
            eta=cfg.eta,
            eta_grid=tuple(cfg.eta_grid),
            target_version=cfg.target_version,
            top_p=cfg.top_p,
            kv_mix=cfg.kv_mix,
            seed=cfg.seed,
        )
    rep["plot"] = str(plot_mixed(rep, out / "theory_mixed.png"))
    _emit(rep, out, "mixed", as_json)
    if not as_json:
        typer.echo(
            f"E_πθ[f] = {rep['E_pi_f']:.6g}  (trajectory KL new‖old = "
            f"{rep['trajectory_kl_new_old']:.3g} nats)"
        )
        for k, v in rep["averaged_over_switch"].items():
            typer.echo(
                f"  {k:9s} bias={v['bias']:+.4g}  relative={v['relative_bias']:+.3%}  "
                f"std={v['std_single_trajectory']:.3g}"
            )
        kv = rep["stale_kv"]
        typer.echo(
            f"stale KV (mix {kv['kv_mix']:g}): recorded logprob bias="
            f"{kv['bias_recorded_logprob']:+.3g}, recomputed-from-label bias="
            f"{kv['bias_version_label_recomputed']:+.4g}"
        )
        tp = rep["top_p"]
        typer.echo(
            f"top-p {tp['top_p']:g}: exact-weight bias={tp['bias_exact_weights']:+.4g} "
            f"missing π mass M={tp['missing_mass']:.4g} (1−E[w]={tp['missing_mass_from_mean_weight']:.4g})"
        )
        typer.echo(f"plot: {rep['plot']}")


@app.command("mixed")
@config_options({n: f"theory.mixed.{n}" for n in MIXED_FLAGS} | {"out": "theory.out"})
def mixed(cfg: RunConfig, as_json: JsonOpt = False) -> None:
    """Exact IS with a mid-trajectory version switch: per-token provenance is unbiased;
    latest/earliest attribution and top-p truncation are not (by how much)."""
    _mixed(cfg.theory.mixed, Path(cfg.theory.out), as_json)


def _filtering(cfg: Any, out: Path, as_json: bool) -> None:
    from provrl.theory.filtering import filtering_report
    from provrl.theory.plots import plot_filtering

    with _bad_parameter():
        rep = filtering_report(cfg.ks, cfg.a, cfg.b, cfg.mc_samples, cfg.seed)
    rep["plot"] = str(plot_filtering(cfg.ks, cfg.a, cfg.b, out / "theory_filtering.png"))
    _emit(rep, out, "filtering", as_json)
    if not as_json:
        rows: dict[str, Any] = rep["k"]  # type: ignore[assignment]
        for k, r in rows.items():
            typer.echo(
                f"k={k:>3}: max keep {r['max_keep_probability_at_p_half']:.6g} (p=½); "
                f"E_Beta({cfg.a:g},{cfg.b:g}) keep = {r['expected_keep_probability_beta']:.5f}"
                f" (MC {r['monte_carlo']:.5f} ± {r['monte_carlo_se']:.1g})"
            )
        typer.echo(f"plot: {rep['plot']}")


@app.command("filtering")
@config_options({n: f"theory.filtering.{n}" for n in FILTERING_FLAGS} | {"out": "theory.out"})
def filtering(cfg: RunConfig, as_json: JsonOpt = False) -> None:
    """Pr(0 < K < k | p) = 1 − p^k − (1−p)^k and its Beta(a, b) expectation (closed form via
    Beta functions), checked by Monte-Carlo; plot for each k."""
    _filtering(cfg.theory.filtering, Path(cfg.theory.out), as_json)


@app.command("all")
@config_options({"out": "theory.out", "mdps": B + "mdps"})
def all_figures(
    cfg: RunConfig,
    docs: Annotated[bool, typer.Option(help="Copy the PNGs into docs/img/.")] = False,
) -> None:
    """Run bound, mm, mixed and filtering (the figures of docs/theory.md) with the
    ``theory`` section's settings."""
    t, out = cfg.theory, Path(cfg.theory.out)
    _bound(t.bound, out, as_json=False, progress=True)
    _mm(t.mm, out, as_json=False)
    _mixed(t.mixed, out, as_json=False)
    _filtering(t.filtering, out, as_json=False)
    if docs:
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        for name in ("bound", "mm", "mixed", "filtering"):
            shutil.copy(out / f"theory_{name}.png", DOCS_IMG / f"theory_{name}.png")
        typer.echo(f"copied 4 figures to {DOCS_IMG}")
