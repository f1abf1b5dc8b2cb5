"""The LLM RL trainer: provenance trajectories in, new weights and a version out.

One :meth:`RLTrainer.step` reads top to bottom:

1. **batch** — validate the trajectories, group them by task, compute one advantage per
   trajectory (GRPO / Dr. GRPO / RLOO, :mod:`provrl.objectives.advantages`), pad them into a
   :class:`~provrl.provenance.TrajectoryBatch` and broadcast A_i over trajectory i's action
   tokens. Prompt and tool tokens are context only.
2. **proximal pass** (no grad) — teacher-forced log π_prox(a_t|h_t) with the weights as they
   are now (logprob[t] belongs to token t and uses the logits at t−1), at each trajectory's
   sampling temperature; also π_θ's entropy, its mass outside the behaviour support,
   log π_ref for the KL penalty, and (TRPO) the full log-softmax at action positions. With
   ``proximal = reuse`` (the default) only the rows the first optimizer step does not see
   get this pass: the first minibatch's training forward runs at these same weights, so its
   own detached π_θ *is* π_prox (with one minibatch and one epoch there is no pass at all).
3. **diagnostics** (after the update, from π_prox) — KL(q‖π_θ), TV, ratio quantiles, ESS of w(τ), truncation, version lag
   (:mod:`provrl.objectives.diagnostics`), all against the *recorded* behaviour logprobs.
4. **update** — AdamW: ``epochs`` × ``minibatches`` optimizer steps, each accumulating the
   exact minibatch loss over micro-batches (token weights ω are computed per minibatch), with
   gradient clipping. TRPO: one
   :func:`provrl.objectives.trpo.trpo_step` on the token surrogate. Every forward is
   *packed* (``packing``, :mod:`provrl.train.packing`): a micro-batch is one row without
   padding, each GRPO group's shared prompt computed once, cut after the last action.
5. **publish** — only a finite update (:func:`nonfinite_reason`): if the loss, a gradient
   norm or a new weight is not finite, the step is refused — no further optimizer step,
   the shuffling RNG set back, ``version`` unchanged — and :class:`StepResult` says why
   (``skipped``) and whether an optimizer step already changed the weights (``restore``:
   the caller puts back the last saved ones, :meth:`provrl.train.learner.LocalLearner.rollback`).
   Otherwise ``version += 1``; metrics go to the :class:`~provrl.report.MetricsWriter`; the
   caller gets :class:`StepResult` ``(version, state_dict, metrics)`` to hot-load into
   engines with ``engine.load_weights(result.state_dict, result.version, mode)``.

The model stays in eval mode (no dropout): π_θ must be the policy the engine samples.

Why one module of ~600 lines: the five stages above are the sections of this file, in
order (CleanRL's habit), so one step of the trainer reads top to bottom in one sitting; the
formulas themselves are pure functions in :mod:`provrl.objectives`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from provrl.failpoints import fault
from provrl.models.precision import autocast
from provrl.objectives import advantages as adv_fns
from provrl.objectives import diagnostics as diag
from provrl.objectives.config import AdvantageConfig, ObjectiveConfig
from provrl.objectives.losses import LossOutput, loss_token_weights, policy_loss
from provrl.objectives.trpo import TRPOStepInfo, subsample_index, trpo_step
from provrl.provenance import UNKNOWN_VERSION, ProvenanceError, Trajectory, TrajectoryBatch
from provrl.report.metrics import MetricsWriter
from provrl.train.config import TRUNCATED_FINISHES, RLConfig
from provrl.train.logprobs import (
    TokenStats,
    check_teacher_forced,
    check_tokenizer,
    head_logits,
    hidden_before,
    token_logprobs_chunked,
)
from provrl.train.lora import add_lora, has_lora, merged_state_dict
from provrl.train.memory import LM_HEAD_BYTES, SavedTensorMeter, step_memory
from provrl.train.optim import adamw
from provrl.train.packing import (
    cut_rows,
    pack,
    packed_hidden,
    plan_micro_batches,
    use_packed_attention,
)
from provrl.train.schedule import lr_at


# ============================================================================ 1. batch
@dataclass
class RLBatch:
    """A padded batch with everything the loss needs per trajectory and per token."""

    tb: TrajectoryBatch
    advantages: torch.Tensor  # [B] one advantage per trajectory
    token_advantages: torch.Tensor  # [B, T] A_i on trajectory i's action tokens, else 0
    group_ids: torch.Tensor  # [B] dense task index
    temperature: torch.Tensor  # [B] sampling temperature (1.0 for greedy rows)
    top_p: torch.Tensor  # [B] float64 sampling top_p
    top_k: torch.Tensor  # [B] int64 sampling top_k (0 = off)
    kv_stale_frac: float  # action tokens that attended to KV older than their version
    kv_unknown_frac: float = 0.0  # action tokens whose engine could not know kv_min
    traj_ids: list[str] = field(default_factory=list)
    loss_rows: torch.Tensor | None = None  # [B] bool: rows the loss trains on (None: all)
    cut: list[np.ndarray] | None = None  # per row: its ids up to its last action (packing)

    def to(self, device: torch.device) -> RLBatch:
        """The same batch with every tensor on ``device`` (the model's)."""
        tb = dataclasses.replace(
            self.tb, **{f.name: getattr(self.tb, f.name).to(device) for f in fields(self.tb)}
        )
        moved = {
            name: getattr(self, name).to(device)
            for name in ("advantages", "token_advantages", "group_ids", "temperature")
        }
        rows = None if self.loss_rows is None else self.loss_rows.to(device)
        return dataclasses.replace(self, tb=tb, loss_rows=rows, **moved)

    @property
    def size(self) -> int:
        return int(self.tb.input_ids.shape[0])

    @property
    def mask(self) -> torch.Tensor:
        return self.tb.action_mask

    @property
    def loss_mask(self) -> torch.Tensor:
        """The action tokens the loss trains on: ``mask`` less the rows left out
        (``mask_truncated``)."""
        if self.loss_rows is None:
            return self.tb.action_mask
        return self.tb.action_mask & self.loss_rows[:, None]


def truncated_rows(trajectories: Sequence[Trajectory]) -> torch.Tensor:
    """[B] bool: trajectories cut short — ``meta['finish']`` in :data:`TRUNCATED_FINISHES`
    (the token budget or the turn limit ran out before an answer). TRL's
    ``mask_truncated_completions`` leaves such completions out of the loss."""
    return torch.tensor([str(t.meta.get("finish")) in TRUNCATED_FINISHES for t in trajectories])


def compute_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, cfg: AdvantageConfig
) -> torch.Tensor:
    """One advantage per trajectory, as configured (group baseline, then batch norm)."""
    if cfg.estimator == "rloo":
        a = adv_fns.rloo_advantages(rewards, group_ids)
    else:
        a = adv_fns.group_advantages(
            rewards, group_ids, std_normalise=cfg.std_normalise, eps=cfg.eps
        )
    if cfg.batch_norm != "none":
        a = adv_fns.batch_normalise(a, center=cfg.batch_norm == "whiten", eps=cfg.eps)
    return a


def prepare_batch(
    trajectories: Sequence[Trajectory],
    *,
    pad_token_id: int,
    vocab_size: int,
    cfg: AdvantageConfig,
    mask_truncated: bool = False,
    tokenizer: dict[str, str] | None = None,
) -> tuple[RLBatch, dict[str, float]]:
    """Validate, group by ``task_id``, compute advantages, pad. Returns the batch and its
    reward / advantage metrics. Errors name the offending trajectory; a trajectory recorded
    under another ``tokenizer`` (identity) than the model's is refused. ``mask_truncated``
    keeps truncated trajectories in the group baselines but out of the loss."""
    if not trajectories:
        raise ValueError("RL step needs at least one trajectory")
    for t in trajectories:
        check_teacher_forced(t, vocab_size)
        check_tokenizer(t, tokenizer, "RL step")
        if t.reward is None or not math.isfinite(t.reward):
            where = f"trajectory {t.traj_id!r} (task {t.task_id!r})"
            raise ProvenanceError(f"{where}: has no finite reward ({t.reward!r})")
    tb = TrajectoryBatch.from_trajectories(trajectories, pad_token_id)
    if not bool(tb.action_mask.any()):
        raise ValueError("RL step: the batch has no action tokens")
    # GRPO groups: the collector stamps meta["group"] = task#round; without it, the task
    groups: dict[str, int] = {}
    group_ids = torch.tensor(
        [groups.setdefault(str(t.meta.get("group", t.task_id)), len(groups)) for t in trajectories]
    )
    rewards = tb.rewards.double()
    a = compute_advantages(rewards, group_ids, cfg).float()
    temps = [t.sampling.temperature if t.sampling.temperature > 0 else 1.0 for t in trajectories]
    kv_lo = [t.kv_min[t.is_action] for t in trajectories]  # UNKNOWN_VERSION: not stale, unknown
    stale = sum(
        int(((lo >= 0) & (lo < t.version[t.is_action])).sum())
        for lo, t in zip(kv_lo, trajectories, strict=True)
    )
    kv_unknown = sum(int((lo == UNKNOWN_VERSION).sum()) for lo in kv_lo)
    batch = RLBatch(
        tb=tb,
        advantages=a,
        token_advantages=a[:, None] * tb.action_mask,
        group_ids=group_ids,
        temperature=torch.tensor(temps, dtype=torch.float32),
        top_p=torch.tensor([t.sampling.top_p for t in trajectories], dtype=torch.float64),
        top_k=torch.tensor([t.sampling.top_k for t in trajectories], dtype=torch.int64),
        kv_stale_frac=stale / max(1, int(tb.action_mask.sum())),
        kv_unknown_frac=kv_unknown / max(1, int(tb.action_mask.sum())),
        traj_ids=[t.traj_id for t in trajectories],
        loss_rows=~truncated_rows(trajectories) if mask_truncated else None,
    )
    metrics = {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()) if len(trajectories) > 1 else 0.0,
        "adv_mean": float(a.mean()),
        "adv_abs_mean": float(a.abs().mean()),
        **adv_fns.zero_signal_fraction(rewards, group_ids),
        "truncated_frac": float(truncated_rows(trajectories).float().mean()),
    }
    return batch, metrics


def micro_batches(rows: torch.Tensor, lengths: torch.Tensor, size: int) -> list[torch.Tensor]:
    """Split ``rows`` into groups of ≤ ``size`` rows of similar length (less padding); each
    group is returned in ascending row order."""
    order = rows[torch.argsort(lengths[rows].cpu(), stable=True)]
    return [chunk.sort().values for chunk in order.split(size)]


def _cut(x: torch.Tensor, rows: torch.Tensor, length: int) -> torch.Tensor:
    return x[rows, :length]


# ============================================================================ 2. proximal pass
@dataclass
class Proximal:
    """What the weights *before* the update say about the batch (all detached)."""

    logprobs: torch.Tensor  # [B, T] log π_prox(a_t|h_t) on action tokens
    entropy: torch.Tensor | None  # [B, T] H(π_prox(·|h_t)) on action tokens
    excluded_mass: torch.Tensor | None  # [B, T] π_prox mass outside the sampler's support
    ref_logprobs: torch.Tensor | None  # [B, T] log π_ref (KL penalty)
    log_softmax: torch.Tensor | None  # [N_act, V] full log π_prox at action positions (TRPO)


# ============================================================================ 5. publish
NONFINITE_KEYS = ("loss", "pg_loss", "grad_norm", "grad_norm_max")
"""The step metrics that must be finite for the update to be published."""


def nonfinite_reason(metrics: dict[str, float], params: Sequence[torch.Tensor]) -> str | None:
    """Why an update must not be published — a metric of :data:`NONFINITE_KEYS` (loss,
    gradient norm) or a parameter that is NaN or ±inf — or None when it is finite."""
    for key in NONFINITE_KEYS:
        if key in metrics and not math.isfinite(metrics[key]):
            return f"{key} is {metrics[key]}"
    with torch.no_grad():
        for p in params:
            if not bool(torch.isfinite(p).all()):
                return "a new weight is not finite"
    return None


def published_weights(model: Any, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Detached CPU copies of ``model``'s state dict (in ``dtype`` when given, floating
    tensors only), one copy per storage: tied weights (SmolLM2's embedding and LM head) stay
    one tensor under both names. A LoRA model publishes its merged weights under the plain
    model's names (:func:`provrl.train.lora.merged_state_dict`)."""
    out: dict[str, torch.Tensor] = {}
    seen: dict[tuple[int, torch.Size, torch.dtype], torch.Tensor] = {}
    state: dict[str, Any] = merged_state_dict(model) if has_lora(model) else model.state_dict()
    for k, v in state.items():
        key = (
            v.untyped_storage().data_ptr() + v.storage_offset() * v.element_size(),
            v.shape,
            v.dtype,
        )
        if key not in seen:
            to = dtype if (dtype is not None and v.is_floating_point()) else v.dtype
            seen[key] = v.detach().to("cpu", dtype=to, copy=True)
        out[k] = seen[key]
    return out


def checkpointed_layers(model: Any) -> list[Any]:
    """The decoder layers HF recomputes in backward (``gradient_checkpointing_enable``).
    Put in train mode alone, so that the rest of the model stays in eval mode; a Llama
    decoder layer has no dropout at ``attention_dropout: 0``, so its output is unchanged."""
    return [m for m in model.modules() if getattr(m, "gradient_checkpointing", False)]


# ============================================================================ the trainer
@dataclass
class StepResult:
    """What one RL step hands back to the orchestrator."""

    version: int
    """The version number of the new weights (the old one + 1)."""
    state_dict: dict[str, torch.Tensor]
    """Detached CPU copies of the new weights: ``engine.load_weights(state_dict, version)``."""
    metrics: dict[str, float]
    """Everything logged for this step (also written to the metrics sink)."""
    skipped: str | None = None
    """Why the step was refused (its loss, a gradient or a new weight not finite), else None.
    A refused step publishes nothing (``state_dict`` empty, ``version`` unchanged) and logs
    nothing to the metrics sink."""
    restore: bool = False
    """A refused step after which the weights are not the old ones (an optimizer step ran
    before the non-finite value showed): the caller restores the last saved weights."""


class RLTrainer:
    """GRPO / PPO-style / TRPO updates of a causal LM from provenance trajectories::

    trainer = RLTrainer(lm.model, RLConfig(), pad_token_id=lm.tokenizer.pad_token_id,
                        version=engine.version, metrics=MetricsWriter(run_dir))
    result = trainer.step(trajectories)       # grouped by meta["group"] (else task_id) for GRPO
    engine.load_weights(result.state_dict, result.version, "keep")
    """

    def __init__(
        self,
        model: Any,
        cfg: RLConfig,
        *,
        pad_token_id: int,
        version: int = 0,
        metrics: MetricsWriter | None = None,
        ref_model: Any | None = None,
        tokenizer: dict[str, str] | None = None,
        publish_dtype: torch.dtype | None = None,
    ) -> None:
        if cfg.lora.enabled and not has_lora(model):
            model = add_lora(model, cfg.lora)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        self.model = model
        self.recomputed = checkpointed_layers(model) if cfg.gradient_checkpointing else []
        """Decoder layers put in train mode at each step (HF recomputes only those)."""
        self.publish_dtype = publish_dtype
        """dtype of the published weights (None: the model's). An engine that computes in
        bfloat16 rounds a float32 copy to the same values, so publishing in its dtype loses
        nothing and halves the copy."""
        self.tokenizer = tokenizer
        """The model's tokenizer identity (``lm.tokenizer_identity``): trajectories recorded
        under another tokenizer are refused (None: not checked)."""
        self.cfg = cfg
        self.pad_token_id = pad_token_id
        self.version = version
        self.metrics = metrics
        self.optimizer_steps = 0
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.device = next(model.parameters()).device
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.optimizer: torch.optim.Optimizer | None = None
        if cfg.optimizer == "adamw":
            self.optimizer = adamw(
                self.params,
                lr=cfg.lr,
                betas=cfg.betas,
                eps=cfg.adam_eps,
                weight_decay=cfg.weight_decay,
            )
        self.ref_model = ref_model
        if cfg.objective.kl_coef > 0 and ref_model is None:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        if cfg.packing != "none":  # SDPA for every other forward of these models
            use_packed_attention(model)
            if self.ref_model is not None:
                use_packed_attention(self.ref_model)
        self.meter = SavedTensorMeter(self.params)
        """Activations held for backward (the step's ``mem_activations_mib``)."""
        self.micro_threads: Callable[[], int] | None = None
        """Asked before each micro-batch, on the thread that computes it: the torch intra-op
        threads to run it with (0: leave them). The async RL loop's ``borrow_cores`` sets it
        (:meth:`provrl.pipeline.build.RLParts.learner_threads`)."""

    # ------------------------------------------------------------------ the step
    def step(self, trajectories: Sequence[Trajectory]) -> StepResult:
        """One RL update from ``trajectories`` (see the module docstring). :attr:`progress`
        reads 0 before and after: the RL loop's pacer reads it from its own thread as soon
        as it has handed the batch over, before this thread has begun on it."""
        self.progress = 0.0
        try:
            return self._step(trajectories)
        finally:
            self.progress = 0.0

    def _step(self, trajectories: Sequence[Trajectory]) -> StepResult:
        t0 = time.perf_counter()
        cfg = self.cfg
        self.model.eval()
        for layer in self.recomputed:  # HF recomputes a layer only in train mode
            layer.train()
        rng, steps_before = self.generator.get_state(), self.optimizer_steps
        batch, metrics = prepare_batch(
            trajectories,
            pad_token_id=self.pad_token_id,
            vocab_size=self.vocab_size,
            cfg=cfg.advantages,
            mask_truncated=cfg.mask_truncated,
            tokenizer=self.tokenizer,
        )
        batch = batch.to(self.device)
        if cfg.packing != "none":
            batch.cut = cut_rows(batch.tb.input_ids, batch.tb.lengths, batch.tb.action_mask)
        self.meter.reset()
        self._packed_tokens = 0  # progress: reset by step()
        everything = torch.arange(batch.size)
        with self.meter.hooks():
            if cfg.optimizer == "trpo":
                prox = self.proximal_pass(batch, everything)
                metrics |= self.trpo_update(batch, prox)
            else:
                orders = [
                    torch.randperm(batch.size, generator=self.generator) for _ in range(cfg.epochs)
                ]
                first = orders[0].tensor_split(min(cfg.minibatches, batch.size))[0]
                reused = first if cfg.proximal == "reuse" else everything[:0]
                rest = everything[~torch.isin(everything, reused)]
                prox = self.proximal_pass(batch, rest)
                metrics |= self.adamw_update(batch, prox, orders, reused)
        skipped = nonfinite_reason(metrics, self.params)
        if skipped is not None:  # refused: the caller neither saves nor loads anything
            self.generator.set_state(rng)
            restore, self.optimizer_steps = self.optimizer_steps != steps_before, steps_before
            metrics["step_s"] = time.perf_counter() - t0
            return StepResult(self.version, {}, metrics, skipped=skipped, restore=restore)
        metrics |= self.diagnostics(batch, prox)
        self.version += 1
        n_act = int(batch.mask.sum())
        n_tok = float(batch.tb.lengths.sum())
        wall = time.perf_counter() - t0
        state = published_weights(self.model, self.publish_dtype)
        logits_bytes = min(cfg.logprob_chunk_tokens, n_act) * self.vocab_size * LM_HEAD_BYTES
        metrics |= {
            "version": float(self.version),
            "num_trajectories": float(batch.size),
            "num_action_tokens": float(n_act),
            "num_tokens": n_tok,
            "num_forward_tokens": float(self._packed_tokens),
            "step_s": wall,
            "tokens_per_s": n_tok / wall,
            "action_tokens_per_s": n_act / wall,
            **step_memory(self.params, self.optimizer, self.meter, state, logits_bytes),
        }
        if self.metrics is not None:
            self.metrics.log(self.version, metrics, prefix="rl")
            lags = self.version - 1 - batch.tb.versions[batch.mask]
            self.metrics.log_histogram(self.version, "rl/version_lag", lags.cpu().numpy())
        return StepResult(self.version, state, metrics)

    # ------------------------------------------------------------------ forwards
    def _stats(
        self, model: Any, batch: RLBatch, rows: torch.Tensor, **kwargs: Any
    ) -> tuple[TokenStats, int]:
        """Teacher-forced statistics of the micro-batch ``rows`` (``[len(rows), L]``, trimmed
        to their longest row), packed when ``packing`` is on; ``kwargs`` go to
        :func:`~provrl.train.logprobs.token_logprobs_chunked`."""
        ids, attn, act, L = self._slice(batch, rows)
        layout = None
        if self.cfg.packing != "none":
            lengths = batch.tb.lengths[rows]
            share = self.cfg.packing == "trie"
            layout = pack(ids, lengths, act, range(len(rows)), share_prefix=share)
            self._packed_tokens += layout.tokens
        else:
            self._packed_tokens += int(rows.numel()) * L
        with self._autocast():
            out = token_logprobs_chunked(
                model,
                ids,
                attn,
                positions=act,
                temperature=batch.temperature[rows],
                chunk_tokens=self.cfg.logprob_chunk_tokens,
                layout=layout,
                **kwargs,
            )
        return out, L

    _packed_tokens = 0
    """Tokens the forwards of the current step computed (packed or padded)."""
    progress = 0.0
    """How far the step in progress is: the share of its rows' tokens whose forward and
    backward are done (AdamW; read from another thread by the RL loop's paced admission);
    0 between steps. It was left at the last step's 1.0 until the next step had prepared
    its batch, so a pacer reading it at the hand-over predicted the step as over and
    started the next groups at once (dev run M: every start at 0 s, nothing mixed)."""

    # ------------------------------------------------------------------ 2. proximal pass
    @torch.no_grad()
    def proximal_pass(self, batch: RLBatch, rows: torch.Tensor | None = None) -> Proximal:
        """Teacher-forced statistics of the current weights for ``rows`` (default all), in
        micro-batches; log π_ref (KL penalty) for every row. Rows not computed stay 0 until
        the training forward fills them (``proximal = reuse``)."""
        cfg, tb = self.cfg, batch.tb
        B, T = tb.input_ids.shape
        rows = torch.arange(B) if rows is None else rows
        zeros = tb.behaviour_logprobs.new_zeros
        logprobs = zeros(B, T)
        entropy = zeros(B, T) if cfg.entropy else None
        excluded = zeros(B, T) if cfg.support_diagnostic and self._truncated(batch) else None
        ref = zeros(B, T) if self.ref_model is not None else None
        full: list[torch.Tensor] = []
        with self._weights_cast_once():
            for micro in self._micro(rows, batch, sort=False) if len(rows) else []:
                out, L = self._stats(
                    self.model,
                    batch,
                    micro,
                    with_entropy=entropy is not None,
                    top_p=batch.top_p[micro] if excluded is not None else None,
                    top_k=batch.top_k[micro] if excluded is not None else None,
                    with_log_softmax=cfg.optimizer == "trpo",
                )
                logprobs[micro, :L] = out.logprobs
                if entropy is not None and out.entropy is not None:
                    entropy[micro, :L] = out.entropy
                if excluded is not None and out.excluded_mass is not None:
                    excluded[micro, :L] = out.excluded_mass
                if out.log_softmax is not None:
                    full.append(out.log_softmax)
        if ref is not None and self.ref_model is not None:
            for micro in self._micro(torch.arange(B), batch, sort=False):
                ref_out, L = self._stats(self.ref_model, batch, micro)
                ref[micro, :L] = ref_out.logprobs
        return Proximal(logprobs, entropy, excluded, ref, torch.cat(full) if full else None)

    @staticmethod
    def _truncated(batch: RLBatch) -> bool:
        """Was any row sampled under top-p / top-k truncation?"""
        return bool(((batch.top_p < 1) | (batch.top_k > 0)).any())

    # ------------------------------------------------------------------ 3. diagnostics
    def diagnostics(self, batch: RLBatch, prox: Proximal) -> dict[str, float]:
        """Trust-region readings of the batch against the weights before the update."""
        m, logq = batch.mask, batch.tb.behaviour_logprobs
        out: dict[str, float] = {}
        out |= diag.behaviour_kl(prox.logprobs, logq, m)
        out |= diag.tv_estimate(prox.logprobs, logq, m)
        out |= diag.ratio_quantiles(prox.logprobs, logq, m)
        out |= diag.trajectory_ess(prox.logprobs, logq, m)
        out |= diag.truncation_stats(batch.tb.kept_mass, m)
        hist = diag.version_lag_histogram(batch.tb.versions, m, self.version)
        out |= diag.lag_summary(hist, self.cfg.lag_buckets)
        out["kv_stale_frac"] = batch.kv_stale_frac
        out["kv_unknown_frac"] = batch.kv_unknown_frac
        if prox.entropy is not None:
            out["entropy"] = float(prox.entropy[m].mean())
        if prox.excluded_mass is not None:
            ex = prox.excluded_mass[m]
            out["pi_excluded_mass"] = float(ex.mean())
            out["pi_excluded_mass_max"] = float(ex.max())
        out |= diag.nonfinite_count(m, logq=logq, logprox=prox.logprobs)
        return out

    # ------------------------------------------------------------------ 4a. AdamW update
    def adamw_update(
        self,
        batch: RLBatch,
        prox: Proximal,
        orders: Sequence[torch.Tensor],
        reused: torch.Tensor,
    ) -> dict[str, float]:
        """``epochs`` × ``minibatches`` optimizer steps on the clipped, corrected loss; epoch
        e visits the rows in ``orders[e]``. ``reused``: the rows whose π_prox the first
        minibatch's training forward provides (it runs before the first step)."""
        cfg = self.cfg
        assert self.optimizer is not None
        pending = torch.zeros(batch.size, dtype=torch.bool)
        pending[reused] = True
        totals: dict[str, float] = {}
        grad_norms: list[float] = []
        total, done = max(float(batch.tb.lengths.sum()) * len(orders), 1.0), 0.0
        for order in orders:
            for mb in order.tensor_split(min(cfg.minibatches, batch.size)):
                weights = torch.zeros_like(batch.tb.behaviour_logprobs)
                weights[mb] = loss_token_weights(
                    batch.loss_mask[mb],
                    cfg.objective.aggregation,
                    norm_tokens=cfg.objective.norm_tokens,
                )
                self.optimizer.zero_grad(set_to_none=True)
                with self._weights_cast_once():
                    for rows in self._micro(mb, batch):
                        out = self._micro_loss(batch, prox, rows, weights, cfg.objective, pending)
                        out.loss.backward()
                        done += float(batch.tb.lengths[rows].sum())
                        self.progress = done / total  # read by the RL loop's paced admission
                        _accumulate(totals, out)
                if bool(pending.any()):
                    raise AssertionError("rows left without π_prox before the first step")
                if fault("rl.nan_grad"):  # tests: what an overflow or a poisoned batch gives
                    next(p for p in self.params if p.grad is not None).grad.fill_(math.nan)  # type: ignore[union-attr]  # fmt: skip
                norm = self._clip_gradients()
                grad_norms.append(norm)
                if not math.isfinite(norm):  # the whole step is refused (step(), 5. publish)
                    self.optimizer.zero_grad(set_to_none=True)
                    break
                self._set_lr()
                self.optimizer.step()
                self.optimizer_steps += 1
            else:
                continue
            break
        n_steps = cfg.epochs * min(cfg.minibatches, batch.size)
        summary = _summarise(totals, n_steps)
        return summary | {
            "grad_norm": float(np.mean(grad_norms)) if grad_norms else math.nan,
            "grad_norm_max": max(grad_norms) if grad_norms else math.nan,
            "optimizer_steps": float(sum(math.isfinite(g) for g in grad_norms)),
            "lr": self.optimizer.param_groups[0]["lr"],
            "proximal_reused_frac": len(reused) / batch.size,
        }

    def _micro_loss(
        self,
        batch: RLBatch,
        prox: Proximal,
        rows: torch.Tensor,
        weights: torch.Tensor,
        objective: ObjectiveConfig,
        pending: torch.Tensor | None = None,
    ) -> LossOutput:
        """Loss of one micro-batch (with grad); ``weights`` are the minibatch's ω. Rows
        still ``pending`` take their π_prox (and its entropy and support mass) from this
        forward, detached: it runs at the weights before the update."""
        fill = pending is not None and bool(pending[rows].any())
        if fill:
            assert pending is not None and bool(pending[rows].all())
        support = fill and prox.excluded_mass is not None
        stats, L = self._stats(
            self.model,
            batch,
            rows,
            entropy_grad=objective.entropy_coef > 0,
            with_entropy=fill and prox.entropy is not None,
            top_p=batch.top_p[rows] if support else None,
            top_k=batch.top_k[rows] if support else None,
        )
        if fill:
            assert pending is not None
            prox.logprobs[rows, :L] = stats.logprobs.detach()
            if prox.entropy is not None and stats.entropy is not None:
                prox.entropy[rows, :L] = stats.entropy.detach()
            if prox.excluded_mass is not None and stats.excluded_mass is not None:
                prox.excluded_mass[rows, :L] = stats.excluded_mass
            pending[rows] = False
        return policy_loss(
            stats.logprobs,
            _cut(prox.logprobs, rows, L),
            _cut(batch.tb.behaviour_logprobs, rows, L),
            _cut(batch.token_advantages, rows, L),
            _cut(batch.loss_mask, rows, L),
            _cut(weights, rows, L),
            objective,
            logp_ref=None if prox.ref_logprobs is None else _cut(prox.ref_logprobs, rows, L),
            entropy=stats.entropy,
        )

    def _clip_gradients(self) -> float:
        max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm is not None else math.inf
        return float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))

    def _set_lr(self) -> None:
        """The scheduled learning rate of the next optimizer step (warmup, then decay)."""
        assert self.optimizer is not None
        c = self.cfg
        lr = lr_at(
            self.optimizer_steps, c.lr_decay_steps, c.lr, c.warmup_steps, c.lr_schedule,
            c.min_lr_ratio,
        )  # fmt: skip
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # ------------------------------------------------------------------ 4b. TRPO update
    def trpo_update(self, batch: RLBatch, prox: Proximal) -> dict[str, float]:
        """One TRPO step on L(θ) = −(corrected, *unclipped* policy loss); with
        ``correction = token_is`` that is L(θ) = Σ_t ω_t π_θ(a_t|h_t)/q_{v_t}(a_t|h_t) A_t.
        The trust region D̄_KL(π_prox‖π_θ) ≤ δ replaces the PPO clip."""
        assert prox.log_softmax is not None
        objective = self.cfg.objective.model_copy(
            update={"clip_eps_low": None, "clip_eps_high": None}
        )
        all_rows = torch.arange(batch.size)
        weights = loss_token_weights(
            batch.loss_mask, objective.aggregation, norm_tokens=objective.norm_tokens
        )
        totals: dict[str, float] = {}

        def surrogate() -> torch.Tensor:
            total = torch.zeros((), device=self.device)
            totals.clear()
            with self._weights_cast_once():
                for rows in self._micro(all_rows, batch, sort=False):
                    out = self._micro_loss(batch, prox, rows, weights, objective)
                    total = total - out.loss
                    _accumulate(totals, out)
            return total

        def mean_kl(rows: torch.Tensor = all_rows) -> torch.Tensor:
            return self._mean_kl(batch, prox, rows)

        fvp_kl = None
        if self.cfg.trpo.fvp_subsample < 1:
            sub = subsample_index(batch.size, self.cfg.trpo.fvp_subsample, self.generator)

            def fvp_kl() -> torch.Tensor:
                return mean_kl(sub)

        info: TRPOStepInfo = trpo_step(
            self.params, surrogate, mean_kl, self.cfg.trpo, fvp_kl=fvp_kl
        )
        self.optimizer_steps += 1
        trpo_metrics = {f"trpo_{k}": float(v) for k, v in info.as_dict().items()}
        return trpo_metrics | _summarise(totals, 1)

    def _action_log_softmax(self, batch: RLBatch, rows: torch.Tensor) -> torch.Tensor:
        """Full log π_θ(·|h_t) ``[N, V]`` at the action positions of ``rows`` (in
        ``positions.nonzero()`` order), at each row's temperature. Memory N · V floats."""
        ids, attn, act, _ = self._slice(batch, rows)
        with self._autocast():
            if self.cfg.packing != "none":
                lengths = batch.tb.lengths[rows]
                share = self.cfg.packing == "trie"
                layout = pack(ids, lengths, act, range(len(rows)), share_prefix=share)
                r, c = act.nonzero(as_tuple=True)
                h = packed_hidden(self.model, layout)[layout.index[r, c - 1]]
            else:
                h, r, _ = hidden_before(self.model, ids, attn, act)
            logits = head_logits(self.model, h)
        temp = batch.temperature[rows][r]
        return torch.log_softmax(logits.float() / temp[:, None], dim=-1)

    def _mean_kl(self, batch: RLBatch, prox: Proximal, rows: torch.Tensor) -> torch.Tensor:
        """D̄_KL = mean over the action tokens of ``rows`` of
        KL(π_prox(·|h_t) ‖ π_θ(·|h_t)) = Σ_v π_prox(v) [log π_prox(v) − log π_θ(v)]."""
        assert prox.log_softmax is not None
        per_row = batch.mask.sum(-1)
        start = torch.cumsum(per_row, 0) - per_row
        total, count = torch.zeros((), device=self.device), 0
        with self._weights_cast_once():
            for micro in self._micro(rows, batch, sort=False):
                idx = torch.cat(
                    [torch.arange(int(start[r]), int(start[r] + per_row[r])) for r in micro]
                )
                old = prox.log_softmax[idx]
                new = self._action_log_softmax(batch, micro)
                total = total + (old.exp() * (old - new)).sum()
                count += idx.numel()
        return total / max(count, 1)

    # ------------------------------------------------------------------ helpers
    def _weights_cast_once(self) -> Any:
        """An autocast context around the micro-batches of one set of weights (one optimizer
        step, one proximal pass, one TRPO surrogate): autocast casts each float32 weight to
        bfloat16 once and keeps the cast until the outermost context exits, where a context
        per micro-batch cast every weight again for each one (and the tied embedding again in
        each LM-head chunk's recompute); each gradient is still cast back per micro-batch.
        The weights must not change inside it: the cache does not see in-place updates, so
        the optimizer steps outside. The first cast of a weight must be made with grad
        enabled (a cast made under ``no_grad`` is cached without its backward), so contexts
        that mix the two (the trainer's grad forwards, then a ``no_grad`` LM head for
        statistics) start with a grad forward, and the ``no_grad`` proximal pass has its own
        context."""
        return self._autocast()

    def _autocast(self) -> Any:
        """``torch.autocast`` in ``cfg.autocast`` (a no-op for float32; ``auto`` resolved for
        the trainer's device, :mod:`provrl.models.precision`)."""
        return autocast(self.cfg.autocast, self.device)

    def _micro(
        self, rows: torch.Tensor, batch: RLBatch, sort: bool = True
    ) -> Iterator[torch.Tensor]:
        """Micro-batches of ``rows``: packed, at most ``micro_batch_tokens`` tokens of the
        layout each, rows that share prefixes together (rows without actions left out: they
        have no loss term; :func:`~provrl.train.packing.plan_micro_batches`); else
        ``micro_batch_size`` rows, of similar length when ``sort``."""
        cfg = self.cfg
        if cfg.packing != "none" and batch.cut is not None:
            share = cfg.packing == "trie"
            plan = plan_micro_batches(
                rows.tolist(), batch.cut, cfg.micro_batch_tokens, share_prefix=share
            )
            groups = [torch.tensor(g, dtype=torch.long) for g in plan]
        elif sort:
            groups = micro_batches(rows, batch.tb.lengths, cfg.micro_batch_size)
        else:
            groups = list(rows.sort().values.split(cfg.micro_batch_size))
        if cfg.progress:
            from tqdm import tqdm

            groups = tqdm(groups, desc="rl micro-batches", leave=False)
        for g in groups:
            n = self.micro_threads() if self.micro_threads is not None else 0
            if n and n != torch.get_num_threads():
                torch.set_num_threads(n)  # this thread's count (an OpenMP ICV)
            yield g

    @staticmethod
    def _slice(
        batch: RLBatch, rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """input_ids, attention mask, action mask of ``rows``, trimmed to their max length."""
        L = int(batch.tb.lengths[rows].max())
        tb = batch.tb
        return (
            _cut(tb.input_ids, rows, L),
            _cut(tb.attention_mask, rows, L),
            _cut(tb.action_mask, rows, L),
            L,
        )


# ============================================================================ metrics helpers
def _accumulate(totals: dict[str, float], out: LossOutput) -> None:
    for key in ("pg_loss", "kl_loss", "entropy"):
        totals[key] = totals.get(key, 0.0) + getattr(out, key)
    totals["loss"] = totals.get("loss", 0.0) + float(out.loss.detach())
    for key in (
        "num_tokens",
        "num_nonfinite",
        "num_masked",
        "num_seq_dropped",
        "num_clipped",
        "weight_sum",
    ):
        totals[key] = totals.get(key, 0.0) + getattr(out, key)
    totals["weight_max"] = max(totals.get("weight_max", 0.0), out.weight_max)


def _summarise(totals: dict[str, float], n_steps: int) -> dict[str, float]:
    """Per-update averages from micro-batch totals (losses are per optimizer step)."""
    if not totals:
        return {}
    tokens = max(totals["num_tokens"], 1.0)
    kept = max(totals["num_tokens"] - totals["num_nonfinite"] - totals["num_masked"], 1.0)
    return {
        "loss": totals["loss"] / n_steps,
        "pg_loss": totals["pg_loss"] / n_steps,
        "kl_ref": totals["kl_loss"] / n_steps,
        "entropy_bonus": totals["entropy"] / n_steps,
        "clip_frac": totals["num_clipped"] / kept,
        "masked_frac": totals["num_masked"] / tokens,
        "nonfinite_tokens": totals["num_nonfinite"],
        "seq_dropped": totals["num_seq_dropped"],
        "weight_mean": totals["weight_sum"] / kept,
        "weight_max": totals["weight_max"],
    }
