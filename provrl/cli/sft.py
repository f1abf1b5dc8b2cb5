"""``provrl sft``: warm-start supervised fine-tuning on trajectory logs.

Heavy imports happen inside the command, so ``provrl --help`` stays instant.

Typical use (teacher traces of the oracle, then an evaluation of the checkpoint)::

    provrl eval --policy oracle --split train --run-dir runs/oracle-train
    provrl sft --traces runs/oracle-train --out runs/sft/ckpt --autocast bfloat16
    provrl eval --policy runs/sft/ckpt --split dev --n 64 --k 8

or on chat data: ``provrl sft --data chat.jsonl --model DIR --out runs/chat-sft``. Every
setting is the run config's ``sft`` section (``--config FILE``, ``--set sft.lr=1e-4``); the
flags are generated from its fields (:mod:`provrl.cli.options`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from provrl.cli.options import config_options
from provrl.run_config.run import RunConfig

SFT_FLAGS = (
    "selection",
    "min_reward",
    "max_per_task",
    "max_traces",
    "epochs",
    "batch_size",
    "micro_batch_tokens",
    "lr",
    "schedule",
    "warmup_steps",
    "min_lr_ratio",
    "weight_decay",
    "max_grad_norm",
    "autocast",
    "seed",
)


@config_options({"model": "model.name"} | {n: f"sft.{n}" for n in SFT_FLAGS})
def sft(
    cfg: RunConfig,
    out: Annotated[Path, typer.Option(help="Checkpoint directory to write (HF layout).")],
    traces: Annotated[
        list[Path] | None,
        typer.Option(
            help="Trajectory log (trajectories.jsonl) or a run directory holding one; "
            "repeat the option for several."
        ),
    ] = None,
    data: Annotated[
        list[Path] | None,
        typer.Option(
            help='Chat JSONL: {"messages": [{"role", "content"}, ...]} per line; the loss is '
            "on the assistant turns. Repeatable; combines with --traces."
        ),
    ] = None,
    run_dir: Annotated[
        Path | None,
        typer.Option(help="Where metrics.jsonl, tb/ and sft.json go (default: OUT-run)."),
    ] = None,
    select: Annotated[
        str | None,
        typer.Option(
            help="Shorthand for the policy's own successes (e.g. --traces PROBE_DIR): all | "
            "shortest (fewest tool calls per task) | per-task-max=M; sets sft.selection and "
            "sft.max_per_task."
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the summary as JSON only (no progress bar).")
    ] = False,
) -> None:
    """Supervised warm start: imitate the action tokens of trajectories (e.g. oracle traces)
    or the assistant turns of chat conversations (the ``sft`` section of the config)."""
    from provrl.train.sft import parse_select, run_sft

    scfg = cfg.sft
    if select is not None:
        try:
            scfg = scfg.model_copy(update=parse_select(select))
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--select") from None
    if as_json:
        scfg = scfg.model_copy(update={"progress": False})
    summary = run_sft(traces or [], cfg.model.name, out, scfg, run_dir=run_dir, data=data or [])
    if as_json:
        summary.pop("losses", None)
        typer.echo(json.dumps(summary))
        return
    typer.echo(
        f"sft: {summary['traces_selected']} of {summary['traces_loaded']} traces "
        f"({', '.join(f'{v} {k}' for k, v in summary['origins_selected'].items())}; "
        f"{summary['duplicates_removed']} duplicates removed), "
        f"{summary['steps']} steps ({summary['skipped_steps']} skipped), "
        f"{summary['action_tokens']} action tokens of {summary['tokens']}"
    )
    typer.echo(
        f"  loss {summary['first_loss']:.4f} → {summary['last_loss']:.4f}; "
        f"{summary['wall_s']:.1f} s ({summary['tokens_per_s']:.0f} tokens/s)"
    )
    typer.echo(f"  checkpoint: {summary['checkpoint']}   metrics: {summary['run_dir']}")
    typer.echo(f"  loss curve: {summary['plot']}")
