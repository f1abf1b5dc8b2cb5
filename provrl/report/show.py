"""Render trajectories in the terminal: text with actions highlighted by version, or a
per-token provenance table."""

from __future__ import annotations

import itertools
import math
import os
from typing import Any

from provrl.provenance import Trajectory
from provrl.trajlog import CorruptLogError, read_trajectories

VERSION_STYLES = ["bold green", "bold cyan", "bold magenta", "bold yellow", "bold blue", "bold red"]


def token_decoder(tokenizer: Any) -> Any:
    """ids → one string per token, from a tokenizer object or name (ids shown if none)."""
    tok = tokenizer
    if isinstance(tokenizer, str):
        try:
            from provrl.models.loading import load_tokenizer

            tok = load_tokenizer(tokenizer)
        except Exception:  # no tokenizer available: show ids
            return lambda ids: [f"<{i}>" for i in ids]
    return lambda ids: tok.batch_decode([[i] for i in ids])


def header(traj: Trajectory) -> str:
    acts = traj.is_action
    versions = sorted(set(traj.version[acts].tolist()))
    kv_lo = int(traj.kv_min[acts].min()) if acts.any() else -1
    lines = [
        f"trajectory {traj.traj_id}  task {traj.task_id}  reward {traj.reward}",
        f"  tokens {len(traj)}  actions {traj.num_actions}  versions {versions}  "
        f"oldest KV {kv_lo}  log q(τ) {traj.log_q():.3f}",
        f"  policy {traj.policy.name} {traj.policy.fingerprint[:19]}  tools {traj.tools.name}",
        f"  sampling T={traj.sampling.temperature} top_p={traj.sampling.top_p} "
        f"top_k={traj.sampling.top_k}  tool calls {len(traj.tool_calls)}",
    ]
    if acts.any():
        truncated = float((traj.kept_mass[acts] < 1).mean())
        lines.append(f"  actions with truncated support (kept_mass < 1): {truncated:.1%}")
    return "\n".join(lines)


def print_trajectory(
    console: Any, traj: Trajectory, decode: Any, *, table: bool = False, max_tokens: int = 200
) -> None:
    """Print one trajectory: a header, then its text (actions coloured by version, other
    tokens dim) or, with ``table``, one row per token with every provenance field."""
    from rich.table import Table
    from rich.text import Text

    console.rule(f"[bold]{traj.traj_id}")
    console.print(header(traj), highlight=False)
    shown = traj.token_id[:max_tokens] if table else traj.token_id
    pieces = decode(shown.tolist())
    if table:
        t = Table("t", "token", "action", "version", "logprob", "kept_mass", "kv", "replica")
        for i in range(len(pieces)):
            a = bool(traj.is_action[i])
            lp = float(traj.logprob[i])
            t.add_row(
                str(i),
                repr(pieces[i]),
                "✓" if a else "",
                str(traj.version[i]) if a else "",
                "" if math.isnan(lp) else f"{lp:.4f}",
                f"{traj.kept_mass[i]:.4f}" if a else "",
                f"{traj.kv_min[i]}..{traj.kv_max[i]}" if a else "",
                str(traj.replica[i]) if a else "",
                style=VERSION_STYLES[traj.version[i] % len(VERSION_STYLES)] if a else "dim",
            )
        console.print(t)
    else:
        text = Text()
        for i, piece in enumerate(pieces):
            if traj.is_action[i]:
                text.append(piece, style=VERSION_STYLES[traj.version[i] % len(VERSION_STYLES)])
            else:
                text.append(piece, style="dim")
        console.print(text)
        legend = ", ".join(f"[{s}]v{v}[/{s}]" for v, s in enumerate(VERSION_STYLES))
        console.print(
            f"[dim]dim = prompt / tool / template tokens;[/dim] colour = action tokens by "
            f"policy version ({legend}, …)"
        )
    for call in traj.tool_calls:
        status = "ok" if call.ok else f"error: {call.error}"
        console.print(
            f"  turn {call.turn}: {call.name}({call.arguments!r}) {status} "
            f"[{call.latency_s * 1000:.1f} ms]",
            highlight=False,
        )


def show_trajectories(
    path: str | os.PathLike[str],
    *,
    limit: int = 3,
    table: bool = False,
    max_tokens: int = 200,
    tokenizer: str = "smollm2-135m",
) -> int:
    """Print up to ``limit`` trajectories of a log (unreadable records are skipped with a
    warning); returns how many were shown. A log with no readable record at all raises
    :class:`~provrl.trajlog.CorruptLogError` (the command must not succeed on nothing)."""
    from rich.console import Console

    console = Console()
    decode = token_decoder(tokenizer)
    shown = 0
    for traj in itertools.islice(read_trajectories(path, strict=False), limit):
        print_trajectory(console, traj, decode, table=table, max_tokens=max_tokens)
        shown += 1
    if shown == 0 and limit > 0:
        raise CorruptLogError(f"{path}: no readable trajectory record")
    return shown
