"""``provrl sft``: warm-start supervised fine-tuning on trajectory logs.

Heavy imports happen inside the command, so ``provrl --help`` stays instant.

Typical use (teacher traces of the oracle, then an evaluation of the checkpoint)::

    provrl eval --policy oracle --split train --run-dir runs/oracle-train
    provrl sft --traces runs/oracle-train --out runs/sft/ckpt --autocast bfloat16
    provrl eval --policy runs/sft/ckpt --split dev --n 64 --k 8

or on chat data: ``provrl sft --data chat.jsonl --model DIR --out runs/chat-sft``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from provrl.train.config import SFTConfig

_C = SFTConfig()


def sft(
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
    model: Annotated[
        str, typer.Option(help="Base model: smollm2-135m, tiny, or a checkpoint directory.")
    ] = "smollm2-135m",
    run_dir: Annotated[
        Path | None,
        typer.Option(help="Where metrics.jsonl, tb/ and sft.json go (default: OUT-run)."),
    ] = None,
    selection: Annotated[
        str, typer.Option(help="all, successful or fewest_tool_calls.")
    ] = _C.selection,
    min_reward: Annotated[float, typer.Option(help="Success threshold on reward.")] = _C.min_reward,
    max_per_task: Annotated[
        int, typer.Option(help="Traces kept per task (0 = no cap).")
    ] = _C.max_per_task,
    max_traces: Annotated[
        int, typer.Option(help="Seeded random subset after selection (0 = all).")
    ] = _C.max_traces,
    epochs: Annotated[int, typer.Option(help="Passes over the traces.")] = _C.epochs,
    batch_size: Annotated[
        int, typer.Option(help="Trajectories per optimizer step.")
    ] = _C.batch_size,
    micro_batch_tokens: Annotated[
        int, typer.Option(help="Padded tokens per forward/backward.")
    ] = _C.micro_batch_tokens,
    lr: Annotated[float, typer.Option(help="Peak AdamW learning rate.")] = _C.lr,
    schedule: Annotated[
        str, typer.Option(help="cosine, linear or constant decay after warmup.")
    ] = _C.schedule,
    warmup_steps: Annotated[int, typer.Option(help="Linear warmup steps.")] = _C.warmup_steps,
    min_lr_ratio: Annotated[
        float, typer.Option(help="Final lr as a fraction of the peak.")
    ] = _C.min_lr_ratio,
    weight_decay: Annotated[float, typer.Option(help="AdamW weight decay.")] = _C.weight_decay,
    max_grad_norm: Annotated[
        float, typer.Option(help="Gradient-norm clip (0 = none).")
    ] = _C.max_grad_norm or 0.0,
    autocast: Annotated[
        str, typer.Option(help="float32 or bfloat16 compute (weights stay float32).")
    ] = _C.autocast,
    seed: Annotated[int, typer.Option(help="Seed of subset and shuffling.")] = _C.seed,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the summary as JSON only (no progress bar).")
    ] = False,
) -> None:
    """Supervised warm start: imitate the action tokens of trajectories (e.g. oracle traces)
    or the assistant turns of chat conversations."""
    from provrl.train.sft import run_sft

    try:
        cfg = SFTConfig(
            selection=selection,  # type: ignore[arg-type]
            min_reward=min_reward,
            max_per_task=max_per_task,
            max_traces=max_traces,
            epochs=epochs,
            batch_size=batch_size,
            micro_batch_tokens=micro_batch_tokens,
            lr=lr,
            schedule=schedule,  # type: ignore[arg-type]
            warmup_steps=warmup_steps,
            min_lr_ratio=min_lr_ratio,
            weight_decay=weight_decay,
            max_grad_norm=max_grad_norm or None,
            autocast=autocast,  # type: ignore[arg-type]
            seed=seed,
            progress=not as_json,
        )
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    summary = run_sft(traces or [], model, out, cfg, run_dir=run_dir, data=data or [])
    if as_json:
        summary.pop("losses", None)
        typer.echo(json.dumps(summary))
        return
    typer.echo(
        f"sft: {summary['traces_selected']} of {summary['traces_loaded']} traces, "
        f"{summary['steps']} steps ({summary['skipped_steps']} skipped), "
        f"{summary['action_tokens']} action tokens of {summary['tokens']}"
    )
    typer.echo(
        f"  loss {summary['first_loss']:.4f} → {summary['last_loss']:.4f}; "
        f"{summary['wall_s']:.1f} s ({summary['tokens_per_s']:.0f} tokens/s)"
    )
    typer.echo(f"  checkpoint: {summary['checkpoint']}   metrics: {summary['run_dir']}")
    typer.echo(f"  loss curve: {summary['plot']}")
