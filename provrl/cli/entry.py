"""The one entry point: ``provrl --help`` lists every subcommand.

Heavy imports (torch, transformers) happen inside commands, so ``--help`` is instant.
Every command lives in ``provrl/cli/`` (the top layer: the library rooms below never import
it), one module per room it drives — ``pipeline.py`` (run, report, probe, filter),
``env.py`` (world, serve-search, index, eval), ``sft.py``, ``classic.py`` (trpo),
``theory.py``, ``bench.py``, ``conformance.py`` — with ``options.py`` (flags generated from the config fields)
and ``config_docs.py``; this file only wires them.

:func:`main` (the ``provrl`` console script) is the one top-level error handler: an
expected error — a bad config, task file, checkpoint, trajectory log, world, search
service, engine request, pydantic validation, a missing file, a usage error — prints ONE
line, ``provrl: error: <message naming the file, line or field>``, and exits 2.
``--debug`` (anywhere on the command line) or ``PROVRL_DEBUG=1`` prints the traceback
first. Anything else is a bug and keeps Python's traceback.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.exceptions import TyperException

from provrl._sys import WriteError, cache_dir
from provrl.cli import config_docs as cd
from provrl.cli.bench import app as bench_app
from provrl.cli.classic import trpo
from provrl.cli.conformance import conformance
from provrl.cli.env import eval_cmd, failures_cmd, index_cmd, serve_search, world
from provrl.cli.pipeline import filter_cmd, probe, report, run
from provrl.cli.sft import sft
from provrl.cli.theory import app as theory_app
from provrl.extras import require

app = typer.Typer(
    help="provrl: RL post-training of tool-using LLM agents with exact per-token provenance. "
    "Errors print one line and exit 2; --debug (or PROVRL_DEBUG=1) adds the traceback.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
models_app = typer.Typer(help="List and check models.", no_args_is_help=True)
traj_app = typer.Typer(help="Inspect trajectory logs.", no_args_is_help=True)

app.add_typer(models_app, name="models")
app.add_typer(traj_app, name="trajectories")
app.add_typer(bench_app, name="bench")
app.add_typer(theory_app, name="theory")
app.command("trpo")(trpo)
app.command("world")(world)
app.command("serve-search")(serve_search)
app.command("index")(index_cmd)
app.command("eval")(eval_cmd)
app.command("failures")(failures_cmd)
app.command("sft")(sft)
app.command("probe")(probe)
app.command("filter")(filter_cmd)
app.command("conformance")(conformance)


# ----------------------------------------------------------------------------- models
@models_app.command("list")
def models_list() -> None:
    """Show the built-in model names."""
    from rich.console import Console
    from rich.table import Table

    from provrl.models.loading import MODELS

    table = Table("name", "description", "cached")
    for info in MODELS.values():
        cached = (cache_dir() / "models" / info.name / "model.safetensors").exists()
        table.add_row(info.name, info.description, "yes" if cached or info.name == "tiny" else "no")
    Console().print(table)


@models_app.command("check")
def models_check(
    name: Annotated[str, typer.Argument(help="Model name (smollm2-135m, tiny) or HF dir.")],
    question: Annotated[
        str, typer.Option(help="Question to answer.")
    ] = "What is the capital of France?",
    max_new_tokens: Annotated[int, typer.Option(help="Tokens to generate.")] = 32,
    dtype: Annotated[str, typer.Option(help="float32 / bfloat16 / float16.")] = "float32",
) -> None:
    """Load a model, answer a question greedily, print the answer and tokens/s."""
    import torch

    from provrl.models.chat import chat_ids, stop_token_ids
    from provrl.models.loading import load_model

    t0 = time.perf_counter()
    lm = load_model(name, dtype=dtype)
    load_s = time.perf_counter() - t0
    ids = chat_ids(lm.tokenizer, [{"role": "user", "content": question}])
    x = torch.tensor([ids])
    t1 = time.perf_counter()
    with torch.no_grad():
        out = lm.model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=list(stop_token_ids(lm.tokenizer)),
            pad_token_id=lm.tokenizer.pad_token_id,
        )
    gen_s = time.perf_counter() - t1
    new = out[0, len(ids) :].tolist()
    n_params = sum(p.numel() for p in lm.model.parameters())
    typer.echo(f"model: {name} ({n_params / 1e6:.1f}M params, loaded in {load_s:.2f}s)")
    typer.echo(f"fingerprint: {lm.fingerprint}")
    typer.echo(f"Q: {question}")
    typer.echo(f"A: {lm.tokenizer.decode(new, skip_special_tokens=True).strip()}")
    typer.echo(f"{len(new)} tokens in {gen_s:.2f}s = {len(new) / gen_s:.1f} tokens/s (batch 1)")


# ----------------------------------------------------------------------------- trajectories
@traj_app.command("show")
def trajectories_show(
    file: Annotated[Path, typer.Argument(help="A trajectory log (.jsonl).", exists=True)],
    limit: Annotated[int, typer.Option(help="Show at most this many trajectories.")] = 3,
    table: Annotated[
        bool, typer.Option(help="One row per token with all provenance fields.")
    ] = False,
    max_tokens: Annotated[int, typer.Option(help="Rows per trajectory in --table mode.")] = 200,
    tokenizer: Annotated[
        str, typer.Option(help="Tokenizer name or dir for decoding.")
    ] = "smollm2-135m",
) -> None:
    """Pretty-print trajectories with per-token provenance; actions are highlighted
    (colour = policy version), prompt/tool tokens are dim."""
    from provrl.report.show import show_trajectories

    show_trajectories(file, limit=limit, table=table, max_tokens=max_tokens, tokenizer=tokenizer)


@traj_app.command("export")
def trajectories_export(
    file: Annotated[Path, typer.Argument(help="A trajectory log (.jsonl).", exists=True)],
    out: Annotated[
        Path | None, typer.Option(help="Output file (default: FILE with .parquet).")
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="parquet (one row per trajectory).")
    ] = "parquet",
) -> None:
    """Export a trajectory log as Parquet (pandas, polars, DuckDB, datasets read it)."""
    if fmt != "parquet":
        raise typer.BadParameter(f"--format {fmt!r}: only parquet")
    require("pyarrow", "export", "provrl trajectories export")
    from provrl.report.export import export_parquet

    summary = export_parquet(file, out or file.with_suffix(".parquet"))
    typer.echo(json.dumps(summary))


# ----------------------------------------------------------------------------- config docs
@app.command("config-docs")
def config_docs(
    check: Annotated[
        bool, typer.Option(help="Only check that docs/config.md is current (exit 1 if not).")
    ] = False,
) -> None:
    """Write docs/config.md: every config key with its TRL / verl name, default and meaning."""
    if check:
        if not cd.is_current():
            typer.echo(f"{cd.DOC}: out of date — run `provrl config-docs`", err=True)
            raise typer.Exit(1)
        typer.echo(f"{cd.DOC}: current")
        return
    typer.echo(f"wrote {cd.write()}")


# ----------------------------------------------------------------------------- run
app.command("run")(run)
app.command("report")(report)
app.command("demo", help="Alias of `provrl run` (what `make demo` runs).")(run)


# ----------------------------------------------------------------------------- errors
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, RuntimeError)
"""What a user's input can cause: every provrl error class derives from ValueError
(ConfigError, EngineError, WorldError, TaskFileError, CheckpointError, ProvenanceError,
CorruptLogError, FilterError; pydantic's ValidationError too) except SearchError, a
RuntimeError like torch's device errors; OSError covers missing files, permissions and
timeouts, and :class:`~provrl._sys.WriteError` a write that found no space, a read-only file
system or no permission — whether Python, safetensors or torch wrote (``RUN/rl/ckpt-v2:
cannot write: No space left on device (ENOSPC)``). Other exceptions are bugs and keep their
traceback."""
MAX_MESSAGE_CHARS = 1000


def one_line(e: BaseException) -> str:
    """``e``'s message as one line (a multi-line message's lines joined with "; "), at most
    :data:`MAX_MESSAGE_CHARS` characters; pydantic errors as ``Model: field 'a.b': msg``."""
    from pydantic import ValidationError

    if isinstance(e, ValidationError):
        parts = [
            f"{e.title}: field {'.'.join(str(p) for p in x['loc']) or '<root>'!r}: {x['msg']}"
            for x in e.errors()
        ]
    else:
        parts = [line.strip() for line in str(e).splitlines() if line.strip()]
    msg = "; ".join(parts) or type(e).__name__
    named = isinstance(e, WriteError) or msg.startswith(type(e).__name__)  # says what failed
    if isinstance(e, OSError | RuntimeError) and not named:
        msg = f"{type(e).__name__}: {msg}"
    if len(msg) > MAX_MESSAGE_CHARS:
        msg = msg[: MAX_MESSAGE_CHARS - 1] + "…"
    return msg


def _close_progress_bars() -> None:
    """Finish any tqdm bar a failed command left open, so the error starts its own line."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        bar.close()


def _warning_line(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> str:
    return f"provrl: warning: {' '.join(str(message).split())}\n"


def main(argv: Sequence[str] | None = None) -> int:
    """The ``provrl`` console script: :data:`app` behind the one top-level error handler
    (see the module docstring). Returns the exit code (0, 2 for an expected error)."""
    args = list(sys.argv[1:] if argv is None else argv)
    end = args.index("--") if "--" in args else len(args)
    debug = "--debug" in args[:end] or os.environ.get("PROVRL_DEBUG", "") not in ("", "0")
    args = [a for i, a in enumerate(args) if i >= end or a != "--debug"]
    fmt, warnings.formatwarning = warnings.formatwarning, _warning_line
    try:
        return _run(args, debug)
    finally:
        warnings.formatwarning = fmt


def _run(args: list[str], debug: bool) -> int:
    try:
        code = app(args=args, prog_name="provrl", standalone_mode=False)
    except TyperException as e:  # click's usage errors: one line, not click's box
        msg = str(getattr(e, "format_message", e.__str__)())
        if type(e).__name__ == "NoArgsIsHelpError":  # `provrl models`: its help
            typer.echo(msg, err=True)
        else:
            ctx = getattr(e, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            typer.echo(f"provrl: error: {' '.join(msg.split())}{hint}", err=True)
        return int(getattr(e, "exit_code", 2))
    except typer.Abort:
        typer.echo("provrl: aborted", err=True)
        return 130
    except EXPECTED_ERRORS as e:
        _close_progress_bars()
        if debug:
            traceback.print_exc()
        typer.echo(f"provrl: error: {one_line(e)}", err=True)
        return 2
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
