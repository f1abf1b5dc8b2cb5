"""Supervised fine-tuning (SFT) on provenance trajectories: the warm start before RL.

The data are trajectories — teacher traces of the oracle (``provrl eval --policy oracle
--split train`` writes them to ``<run>/trajectories.jsonl``) or successful probe rollouts —
or chat conversations ``{"messages": [...]}`` (:mod:`provrl.train.chat_data`: assistant
turns become the action tokens). Trajectories are refused when their policy identity names
another tokenizer than the model's (:func:`provrl.train.logprobs.check_tokenizer`).
The model imitates their **action** tokens and reads every other token as context:

.. math::

    L(θ) = -\\frac{1}{N} \\sum_i \\sum_{t:\\, m_{i,t}=1} \\log π_θ(x_{i,t} \\mid x_{i,<t}),
    \\qquad N = \\sum_i \\sum_t m_{i,t}

with m_{i,t} = ``is_action``: prompt, tool-observation and chat-template tokens condition
the model but are never targets. The sum runs over the trajectories of one optimizer step.

One run, top to bottom (:func:`train_sft`):

1. **select** — :func:`select_traces`: keep all / successful / fewest-tool-call traces, at
   most ``max_per_task`` per task, then a seeded subset of ``max_traces``.
2. **plan** — :func:`plan_steps`: per epoch a seeded permutation, cut into optimizer steps of
   ``batch_size`` trajectories; each step packed into micro-batches of at most
   ``micro_batch_tokens`` padded tokens (:func:`pack_micro_batches`). N is counted over the
   whole step, so accumulating the micro-batch losses Σ_{t∈micro} −log π / N is exact.
3. **update** — per step: forward/backward every micro-batch (teacher-forced logprobs at the
   action positions only, :func:`provrl.train.logprobs.token_logprobs_chunked`, never a
   ``[B, T, V]`` tensor), clip the global gradient norm, AdamW at the scheduled learning
   rate :func:`lr_at` (warmup, then cosine / linear decay). A step whose gradient norm is
   not finite is skipped.
4. **log** — loss, lr, grad norm, tokens/s per step through
   :class:`~provrl.report.MetricsWriter`; a progress bar with ETA.
5. **save** — :func:`run_sft` writes the weights with
   :func:`provrl.models.save_checkpoint` (safetensors, HF layout), loadable by
   ``provrl.models.load_model(dir)`` and therefore by ``provrl eval --policy <dir>``.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from provrl._sys import write_json
from provrl.failpoints import failpoint
from provrl.models.checkpoint import save_checkpoint
from provrl.models.loading import load_model
from provrl.models.precision import autocast
from provrl.provenance import ProvenanceError, Trajectory, TrajectoryBatch
from provrl.report.metrics import MetricsWriter
from provrl.report.plots import plot_sft_loss
from provrl.train.chat_data import load_chat_jsonl
from provrl.train.config import SFTConfig
from provrl.train.logprobs import check_teacher_forced, check_tokenizer, token_logprobs_chunked
from provrl.train.optim import adamw
from provrl.train.packing import pack, use_packed_attention
from provrl.train.schedule import lr_at as schedule_lr
from provrl.trajlog import read_trajectories


# ============================================================================ 0. load
def load_traces(paths: Sequence[str | os.PathLike[str]]) -> list[Trajectory]:
    """Trajectories from one or more logs (a ``trajectories.jsonl`` or a run directory that
    holds one). Each is validated; errors name the file and line."""
    out: list[Trajectory] = []
    if not paths:
        raise ValueError("SFT: no trajectory files given")
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            p = p / "trajectories.jsonl"
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no such trajectory log")
        n_before = len(out)
        for line, traj in enumerate(read_trajectories(p), start=1):
            try:
                check_trace(traj)
            except ProvenanceError as e:
                raise ProvenanceError(f"{p}:{line}: {e}") from e
            out.append(traj)
        if len(out) == n_before:
            raise ValueError(f"{p}: no trajectories (an empty log)")
    return out


def check_trace(traj: Trajectory, vocab_size: int | None = None) -> None:
    """A trace SFT can learn from: valid provenance, at least one action token, no action
    at position 0 (it has no context), token ids inside the vocabulary."""
    check_teacher_forced(traj, vocab_size)
    if traj.num_actions == 0:
        where = f"trajectory {traj.traj_id!r} (task {traj.task_id!r})"
        raise ProvenanceError(f"{where}: has no action tokens — nothing to imitate")


# ============================================================================ 1. select
def num_tool_calls(traj: Trajectory) -> float:
    """Tool calls of a trace: ``metrics['num_tool_calls']`` (written by the environment),
    else the recorded calls other than the final answer."""
    if "num_tool_calls" in traj.metrics:
        return float(traj.metrics["num_tool_calls"])
    return float(sum(c.name != "answer" for c in traj.tool_calls))


def trace_origin(traj: Trajectory) -> str:
    """Who wrote a trace: ``teacher (oracle)`` (the scripted oracle), ``teacher (explorer)``
    (the exploratory teacher), ``chat data`` (a chat
    JSONL file) or ``policy`` (a model's own sample, e.g. a probe success)."""
    name = traj.policy.name if traj.policy is not None else ""
    if name in ("oracle", "explorer"):
        return f"teacher ({name})"
    if name == "chat-data":
        return "chat data"
    return "policy"


def dedupe_traces(trajs: Sequence[Trajectory]) -> list[Trajectory]:
    """One trace per (task, token sequence): k probe samples of a task often coincide, and an
    identical trace imitated twice only weighs that task more. The first occurrence stays."""
    seen: set[tuple[str, bytes]] = set()
    out = []
    for t in trajs:
        key = (t.task_id, np.asarray(t.token_id, dtype=np.int64).tobytes())
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def parse_select(spec: str) -> dict[str, Any]:
    """``--select`` shorthand → ``sft`` fields: ``all`` (every success), ``shortest`` (per
    task the successes with the fewest tool calls), ``per-task-max=M`` (at most M successes
    per task, fewest tool calls first)."""
    if spec == "all":
        return {"selection": "successful", "max_per_task": 0}
    if spec == "shortest":
        return {"selection": "fewest_tool_calls"}
    if spec.startswith("per-task-max="):
        m = spec.removeprefix("per-task-max=")
        if m.isdigit() and int(m) > 0:
            return {"selection": "successful", "max_per_task": int(m)}
    raise ValueError(f"--select {spec!r}: expected all, shortest or per-task-max=M (M ≥ 1)")


def select_traces(trajs: Sequence[Trajectory], cfg: SFTConfig) -> list[Trajectory]:
    """The traces to imitate, in a deterministic order (task, then preference).

    * ``all`` — every trace; ``successful`` — reward ≥ ``min_reward``;
      ``fewest_tool_calls`` — successful, and per task only the traces whose tool-call count
      is that task's minimum (the most efficient demonstrations).
    * per task, traces are ordered by (tool calls, tokens, traj_id) and cut to
      ``max_per_task`` (0 = no cap);
    * finally a seeded random subset of ``max_traces`` (0 = all).
    """
    if not trajs:
        raise ValueError("SFT: the trace set is empty")
    kept = list(trajs)
    if cfg.selection != "all":
        kept = [t for t in kept if t.reward is not None and t.reward >= cfg.min_reward]
        if not kept:
            raise ValueError(
                f"SFT: none of the {len(trajs)} traces is successful "
                f"(reward ≥ min_reward = {cfg.min_reward})"
            )
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in kept:
        by_task[t.task_id].append(t)
    out: list[Trajectory] = []
    for task_id in sorted(by_task):
        group = sorted(by_task[task_id], key=lambda t: (num_tool_calls(t), len(t), t.traj_id))
        if cfg.selection == "fewest_tool_calls":
            fewest = num_tool_calls(group[0])
            group = [t for t in group if num_tool_calls(t) == fewest]
        if cfg.max_per_task:
            group = group[: cfg.max_per_task]
        out.extend(group)
    if cfg.max_traces and cfg.max_traces < len(out):
        idx = np.sort(np.random.default_rng(cfg.seed).choice(len(out), cfg.max_traces, False))
        out = [out[int(i)] for i in idx]
    return out


# ============================================================================ 2. plan
def pack_micro_batches(
    lengths: Sequence[int], rows: Sequence[int], budget: int, *, padded: bool = True
) -> list[list[int]]:
    """Pack ``rows`` into micro-batches of at most ``budget`` tokens — padded size (rows ×
    longest row), or with ``padded=False`` the rows' summed length (a packed forward):
    longest first, greedily; a row longer than the budget runs alone."""
    order = sorted(rows, key=lambda r: (-lengths[r], r))
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0
    for r in order:
        longest = lengths[current[0]] if current else lengths[r]
        cost = (len(current) + 1) * longest if padded else total + lengths[r]
        if current and cost > budget:
            groups.append(current)
            current, total = [], 0
        current.append(r)
        total += lengths[r]
    if current:
        groups.append(current)
    return groups


def plan_steps(lengths: Sequence[int], cfg: SFTConfig) -> list[tuple[int, list[list[int]]]]:
    """``(epoch, micro-batches)`` for every optimizer step of the run. Each epoch visits
    every trace once, in the order of a permutation seeded by (seed, epoch)."""
    steps: list[tuple[int, list[list[int]]]] = []
    for epoch in range(cfg.epochs):
        perm = np.random.default_rng([cfg.seed, epoch]).permutation(len(lengths))
        for s in range(0, len(perm), cfg.batch_size):
            rows = [int(r) for r in perm[s : s + cfg.batch_size]]
            micro = pack_micro_batches(lengths, rows, cfg.micro_batch_tokens, padded=cfg.packing == "none")  # fmt: skip
            steps.append((epoch, micro))
    return steps


# ============================================================================ 3. loss
def nll_sum(logprobs: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """Σ_{t: m_t=1} −log π_θ(x_t | x_<t): the summed NLL of the action tokens. Only the
    masked entries are read (``torch.where``), so a non-finite value elsewhere is ignored."""
    return -torch.where(action_mask, logprobs, torch.zeros_like(logprobs)).sum()


def sft_loss(logprobs: torch.Tensor, action_mask: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """L = −(1/N) Σ_{t: m_t=1} log π_θ(x_t | x_<t) with N = ``num_tokens``, the action
    tokens of the whole optimizer step (so micro-batch losses add up to the step's loss)."""
    if num_tokens <= 0:
        raise ValueError("sft_loss: the step has no action tokens")
    return nll_sum(logprobs, action_mask) / num_tokens


def micro_logprobs(
    model: Any, batch: TrajectoryBatch, cfg: SFTConfig, device: torch.device
) -> torch.Tensor:
    """Teacher-forced log π_θ at the action positions of a micro-batch (0 elsewhere):
    packed (:mod:`provrl.train.packing`, the shared system prompt once) when
    ``cfg.packing``, else the padded rows."""
    ids = batch.input_ids.to(device)
    attn = batch.attention_mask.to(device)
    act = batch.action_mask.to(device)
    layout = None
    if cfg.packing != "none" and bool(act.any()):
        use_packed_attention(model)
        share = cfg.packing == "trie"
        layout = pack(ids, batch.lengths, act, range(ids.shape[0]), share_prefix=share)
    with autocast(cfg.autocast, device):  # auto: the device's fast dtype (models.precision)
        return token_logprobs_chunked(
            model, ids, attn, positions=act, chunk_tokens=cfg.logprob_chunk_tokens, layout=layout
        ).logprobs


def weights_cast_once(cfg: SFTConfig, device: torch.device) -> Any:
    """One autocast context around the micro-batches of an optimizer step (or of a no-grad
    pass over a set of traces, :func:`mean_nll`): autocast casts
    each float32 weight to bfloat16 once and keeps the cast until the outermost context
    exits, where the context of each micro-batch alone cast every weight again per
    micro-batch (each gradient is still cast back per micro-batch). The optimizer steps
    outside it: the cache does not see in-place updates. The RL trainer does the same
    (``RLTrainer._weights_cast_once``)."""
    return autocast(cfg.autocast, device)


def accumulate_gradients(
    model: Any,
    trajectories: Sequence[Trajectory],
    micro: Sequence[Sequence[int]],
    cfg: SFTConfig,
    *,
    pad_token_id: int,
) -> tuple[float, int]:
    """Forward/backward every micro-batch of one optimizer step, adding ∇L to ``.grad``:

        ∇L = Σ_micro ∇[ −(1/N) Σ_{t ∈ micro, m_t=1} log π_θ(x_t | x_<t) ],  N = the step's
        action tokens,

    which equals the gradient of the step as one batch. Returns (L, padded tokens)."""
    device = next(model.parameters()).device
    n_act = sum(trajectories[r].num_actions for rows in micro for r in rows)
    loss_sum, padded = 0.0, 0
    with weights_cast_once(cfg, device):
        for rows in micro:
            tb = TrajectoryBatch.from_trajectories([trajectories[r] for r in rows], pad_token_id)
            logp = micro_logprobs(model, tb, cfg, device)
            loss = sft_loss(logp, tb.action_mask.to(device), n_act)
            loss.backward()
            loss_sum += float(loss.detach())
            padded += tb.input_ids.numel()
    return loss_sum, padded


@torch.no_grad()
def mean_nll(
    model: Any,
    trajs: Sequence[Trajectory],
    cfg: SFTConfig,
    *,
    pad_token_id: int,
) -> float:
    """Mean NLL per action token of ``trajs`` under ``model`` (no grad): the SFT loss of the
    whole set as one step, e.g. on held-out teacher traces."""
    device = next(model.parameters()).device
    lengths = [len(t) for t in trajs]
    total, count = 0.0, 0
    with weights_cast_once(cfg, device):  # no grad throughout: the casts are made once
        for rows in pack_micro_batches(lengths, range(len(trajs)), cfg.micro_batch_tokens):
            tb = TrajectoryBatch.from_trajectories([trajs[r] for r in rows], pad_token_id)
            lp = micro_logprobs(model, tb, cfg, device)
            total += float(nll_sum(lp, tb.action_mask.to(device)))
            count += int(tb.action_mask.sum())
    return total / max(count, 1)


# ============================================================================ 4. schedule
def lr_at(step: int, total_steps: int, cfg: SFTConfig) -> float:
    """Learning rate of optimizer step ``step`` (0-based) out of S = ``total_steps``:

    * warmup, s < W:  η_s = η · (s + 1) / W
    * then, with p = (s − W) / max(1, S − W − 1) ∈ [0, 1] and r = ``min_lr_ratio``:
      cosine η_s = η · [r + (1 − r) · ½ (1 + cos π p)];  linear η_s = η · [1 − (1 − r) p];
      constant η_s = η.

    (:func:`provrl.train.schedule.lr_at`, which the RL trainer shares.)"""
    return schedule_lr(step, total_steps, cfg.lr, cfg.warmup_steps, cfg.schedule, cfg.min_lr_ratio)


# ============================================================================ the run
@dataclass
class SFTResult:
    """What a training run did (also the body of ``sft.json``)."""

    num_traces: int
    steps: int
    skipped_steps: int
    epochs: int
    tokens: int
    """Real (unpadded) tokens run forward and backward, all epochs."""
    action_tokens: int
    """Action tokens trained on (the loss targets), all epochs."""
    wall_s: float
    tokens_per_s: float
    first_loss: float
    last_loss: float
    losses: list[float] = field(default_factory=list)
    """Training loss of every optimizer step (NaN for a skipped step)."""

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d["losses"] = [round(x, 5) for x in self.losses]
        return d


def train_sft(
    model: Any,
    trajectories: Sequence[Trajectory],
    cfg: SFTConfig,
    *,
    pad_token_id: int,
    metrics: MetricsWriter | None = None,
) -> SFTResult:
    """Fine-tune ``model`` in place on the action tokens of ``trajectories`` (already
    selected: see :func:`select_traces`). Returns what happened; see the module docstring."""
    if not trajectories:
        raise ValueError("SFT: no trajectories to train on")
    vocab = int(model.get_output_embeddings().weight.shape[0])
    for t in trajectories:
        check_trace(t, vocab)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("SFT: the model has no trainable parameters")
    optimizer = adamw(
        params, lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay
    )
    lengths = [len(t) for t in trajectories]
    steps = plan_steps(lengths, cfg)
    max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
    was_training = model.training
    model.train()
    recompute = cfg.gradient_checkpointing and not getattr(model, "is_gradient_checkpointing", True)
    if recompute:  # each decoder layer's activations recomputed in backward, not held
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    bar = _progress(len(steps), cfg.progress)
    losses: list[float] = []
    skipped = tokens_seen = actions_seen = 0
    t_start = time.perf_counter()
    try:
        for s, (epoch, micro) in enumerate(steps):
            t0 = time.perf_counter()
            n_act = sum(trajectories[r].num_actions for rows in micro for r in rows)
            n_tok = sum(lengths[r] for rows in micro for r in rows)
            lr = lr_at(s, len(steps), cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad(set_to_none=True)
            loss_sum, padded = accumulate_gradients(
                model, trajectories, micro, cfg, pad_token_id=pad_token_id
            )
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
            if math.isfinite(grad_norm) and math.isfinite(loss_sum):
                optimizer.step()
                losses.append(loss_sum)
            else:
                skipped += 1
                losses.append(math.nan)
            optimizer.zero_grad(set_to_none=True)
            tokens_seen += n_tok
            actions_seen += n_act
            dt = time.perf_counter() - t0
            if metrics is not None:
                metrics.log(
                    s + 1,
                    {
                        "loss": loss_sum,
                        "lr": lr,
                        "grad_norm": grad_norm,
                        "epoch": epoch,
                        "tokens": n_tok,
                        "action_tokens": n_act,
                        "padding_frac": 1 - n_tok / max(padded, 1),
                        "micro_batches": len(micro),
                        "tokens_per_s": n_tok / dt,
                        "action_tokens_per_s": n_act / dt,
                        "step_s": dt,
                        "skipped_steps": skipped,
                        "total_steps": len(steps),
                    },
                    prefix="sft",
                )
            failpoint("sft.step")  # crash tests: a step trained and logged, SFT not finished
            bar.set_postfix(loss=f"{loss_sum:.3f}", lr=f"{lr:.2e}", epoch=epoch, refresh=False)
            bar.update(1)
    finally:
        bar.close()
        model.train(was_training)
        if recompute:
            model.gradient_checkpointing_disable()
    wall = time.perf_counter() - t_start
    finite = [x for x in losses if math.isfinite(x)]
    return SFTResult(
        num_traces=len(trajectories),
        steps=len(steps),
        skipped_steps=skipped,
        epochs=cfg.epochs,
        tokens=tokens_seen,
        action_tokens=actions_seen,
        wall_s=wall,
        tokens_per_s=tokens_seen / wall if wall > 0 else math.nan,
        first_loss=finite[0] if finite else math.nan,
        last_loss=finite[-1] if finite else math.nan,
        losses=losses,
    )


def run_sft(
    traces: Sequence[str | os.PathLike[str]] | Sequence[Trajectory],
    model: str,
    out: str | os.PathLike[str],
    cfg: SFTConfig,
    *,
    run_dir: str | os.PathLike[str] | None = None,
    dtype: str = "float32",
    eval_traces: Sequence[Trajectory] = (),
    data: Sequence[str | os.PathLike[str]] = (),
    plot: bool = True,
) -> dict[str, Any]:
    """Load ``model`` (a name or a directory), select and train on ``traces`` (log files or
    trajectories) and on the conversations of the chat JSONL files ``data`` (assistant
    turns are the targets, :mod:`provrl.train.chat_data`); traces tokenized by another
    tokenizer than the model's are refused. Save the checkpoint to ``out``, the loss curve
    to ``run_dir/sft_loss.png`` (``plot``) and return the summary (also written to
    ``run_dir/sft.json``; metrics to ``run_dir/metrics.jsonl``, default ``run_dir = out``'s
    parent / ``out.name + '-run'``). ``eval_traces``: held-out traces whose mean action NLL
    is reported before and after training."""
    all_traces: list[Trajectory] = []
    sources: list[str] = []
    if traces and isinstance(traces[0], Trajectory):
        all_traces = [t for t in traces if isinstance(t, Trajectory)]
        for t in all_traces:
            check_trace(t)
        sources = ["<in memory>"]
    elif traces:
        paths = [Path(p) for p in traces if not isinstance(p, Trajectory)]
        all_traces = load_traces(paths)
        sources = [str(p) for p in paths]
    if not traces and not data:
        raise ValueError("SFT: give trajectory logs (--traces) or chat JSONL files (--data)")
    lm = load_model(model, dtype=dtype)
    if data:
        for path in data:
            chats = load_chat_jsonl(path, lm.tokenizer)
            for t in chats:
                check_trace(t)
            all_traces.extend(chats)
            sources.append(str(path))
    for t in all_traces:
        check_tokenizer(t, lm.tokenizer_identity, f"SFT on {model!r}")
    unique = dedupe_traces(all_traces)
    selected = select_traces(unique, cfg)
    pad = lm.tokenizer.pad_token_id
    if pad is None:
        pad = lm.tokenizer.eos_token_id
    out = Path(out)
    run = Path(run_dir) if run_dir is not None else out.parent / f"{out.name}-run"
    summary: dict[str, Any] = {
        "base_model": model,
        "base_fingerprint": lm.fingerprint,
        "traces": sources,
        "traces_loaded": len(all_traces),
        "duplicates_removed": len(all_traces) - len(unique),
        "traces_selected": len(selected),
        "origins_selected": dict(Counter(trace_origin(t) for t in selected)),
        "config": cfg.model_dump(),
    }
    if eval_traces:
        summary["eval_nll_before"] = mean_nll(lm.model, eval_traces, cfg, pad_token_id=pad)
    with MetricsWriter(run) as mw:
        result = train_sft(lm.model, selected, cfg, pad_token_id=pad, metrics=mw)
        if eval_traces:
            summary["eval_nll_after"] = mean_nll(lm.model, eval_traces, cfg, pad_token_id=pad)
            mw.log(result.steps, {"eval_nll": summary["eval_nll_after"]}, prefix="sft")
    summary |= result.summary()
    save_sft_checkpoint(lm.model, lm.tokenizer, out, summary)
    summary["checkpoint"] = str(out)
    summary["run_dir"] = str(run)
    if plot:
        summary["plot"] = str(plot_sft_loss(result.losses, run / "sft_loss.png", model))
    write_json(run / "sft.json", summary)  # strict JSON: a skipped step's loss is null
    return summary


def save_sft_checkpoint(
    model: Any, tokenizer: Any, out: str | os.PathLike[str], summary: dict[str, Any]
) -> Path:
    """Weights + tokenizer as safetensors in HF layout (atomic, :func:`save_checkpoint`), with
    the run summary (minus per-step losses) in ``provrl.json``; the model is left in eval
    mode, the mode the engine samples in."""
    model.eval()
    meta = {k: v for k, v in summary.items() if k != "losses"}
    return save_checkpoint(model, tokenizer, out, kind="sft", **meta)


def _progress(total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="sft", unit="step", dynamic_ncols=True, disable=not enabled)
