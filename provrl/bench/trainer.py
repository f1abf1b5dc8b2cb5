"""``provrl bench trainer``: one full RL step (π_θ forward, loss, backward, optimizer)
replayed standalone on a fixed batch, side by side with a TRL-style reference step.

The batch is a fixture of real trajectories (``provrl/bench/data/trainer_batch.jsonl``:
4 GRPO groups × 8 samples that SmolLM2's warm-started policy produced in the default preset's
probe, with their prompts, tool results and action tokens — :func:`make_fixture` rebuilds it
from any run's probe log). Two sides, each step run in a **fresh subprocess** so that its
peak resident memory is its own, interleaved over ``repeats``:

* ``provrl`` — :class:`provrl.train.rl.RLTrainer` ``.step`` with the default preset's
  ``rl`` section (or ``rl_overrides``);
* ``reference`` — the step the way TRL's ``GRPOTrainer`` computes it: a transformers forward
  on padded micro-batches (prompts left-padded, completions right-padded), logits for every
  completion position (``logits_to_keep``, tool results included) and a full log-softmax,
  bf16 autocast, the clipped GRPO token loss against the detached log-probabilities (one
  iteration), gradient clipping, torch AdamW;
* ``reference_plain`` — the plainest fast TRL-style step: the same padded micro-batches and
  loss, the LM head only at the positions that predict an action, log π = z_a − logsumexp z,
  fused AdamW (:class:`ReferenceStep`; ``tests/bench/test_trainer_bench.py`` checks that both
  arms compute provrl's loss and gradients on the same batch).

``speedup_vs_reference`` is provrl against the faster reference arm (``reference_arm``);
``speedup_without_sharing`` is ``provrl_rows`` (packed, no prefix shared — what a batch
without shared prefixes gets) against it. ``prefix_sharing_factor`` says how much of the
speed-up is work not done: ``fixture`` — the tokens teacher-forcing needs over those of one
prefix trie of the whole batch (:func:`prefix_sharing_factor`); ``fixture_step`` — the
batch's tokens over the forward tokens provrl's step computed (its micro-batches split the
trie); ``real_run`` — the median over the RL steps of a run given as ``sharing_run``
(:func:`run_sharing_factors`).

Each child loads the model, runs one warm-up step under :class:`torch.utils.flop_counter.
FlopCounterMode` (the matmul FLOPs of exactly that work; CPU attention kernels are not
counted, so the FLOP rate is a lower bound), resets its high-water mark
(``/proc/self/clear_refs`` ← 5) and times one step. The step times come from ``repeats``
interleaved children per side that run glibc's allocator as the RL loop does; the memory
figures from one more child per side that pins glibc's mmap threshold, so that its peak
repeats (:attr:`SideSpec.pin_allocator`). It reports tokens/s (every token of every
trajectory over the step's wall time), action tokens/s, the peak RSS and a memory
breakdown: runtime (the process before the model), weights, gradients, optimizer state,
activations (the peak bytes autograd held for backward, counted by saved-tensor hooks by
storage), the transient LM-head logits, the published state-dict copy, and what none of
them explains. The parent also measures the bf16 (and fp32) matmul rate at SmolLM2's shapes
on the same threads, so ``roofline_fraction`` = achieved FLOP/s / that rate comes from the
same run. ``lag0`` samples a few turns from a :class:`~provrl.engine.LocalEngine` at the
trainer's own weights and reports the trainer–engine mismatch |log π_θ − log q| and the k3 KL
at lag 0, for each engine dtype × trainer autocast.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FIXTURE = Path(__file__).parent / "data" / "trainer_batch.jsonl"
"""The shipped batch: 4 groups × 8 trajectories of SmolLM2 in the default preset's probe."""

VARIANTS: dict[str, dict[str, Any]] = {
    "provrl": {},
    "provrl_rows": {"packing": "rows"},
    "provrl_one_minibatch": {"minibatches": 1},
}
"""provrl sides: the default preset's ``rl`` section with these overrides — as configured;
packed without sharing prefixes (what the trie adds); one optimizer step per batch (no
proximal pass at all)."""
REFERENCES = {"reference": False, "reference_plain": True}
"""Reference arms → ``ReferenceStep(plain=…)``: TRL-style with logits at every completion
position and a full log-softmax; the plainest fast TRL-style step."""
SIDES = (*VARIANTS, *REFERENCES)

MATMUL_SHAPES = ((4096, 576, 1536), (4096, 1536, 576), (4096, 576, 49152))
"""(M, K, N) of SmolLM2-135M's MLP up / down projections and LM head at 4,096 tokens."""


# ------------------------------------------------------------------------------ the batch
def load_batch(path: str | os.PathLike[str] | None = None) -> list[Any]:
    """The fixture's trajectories (``path`` or the shipped one), rewards included."""
    from provrl.trajlog import read_all

    p = Path(path) if path else FIXTURE
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no trainer-bench fixture (make one with make_fixture)")
    return read_all(p)


def make_fixture(
    log: str | os.PathLike[str],
    out: str | os.PathLike[str] = FIXTURE,
    *,
    groups: int = 4,
    k: int = 8,
    seed: int = 0,
) -> dict[str, Any]:
    """Write ``groups`` complete groups of ``k`` trajectories from a run's trajectory log
    (``RUN/probe/trajectories.jsonl``) to ``out``: groups with signal (0 < K < k, what RL
    trains on) first, in a seeded order. Returns the fixture's shape."""
    from collections import defaultdict

    from provrl.trajlog import TrajectoryWriter, read_all

    by_group: dict[str, list[Any]] = defaultdict(list)
    for t in read_all(log):
        by_group[str(t.meta.get("group", t.task_id))].append(t)
    full = [g for g in by_group.values() if len(g) >= k]
    rng = np.random.default_rng(seed)
    order = [full[int(i)] for i in rng.permutation(len(full))]

    def successes(g: list[Any]) -> int:
        return sum(float(t.metrics.get("exact_match", 0.0)) > 0 for t in g[:k])

    order.sort(key=lambda g: not (0 < successes(g) < k))  # stable: signal first
    if len(order) < groups:
        raise ValueError(f"{log}: {len(order)} complete groups of {k}, need {groups}")
    chosen = [t for g in order[:groups] for t in g[:k]]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).unlink(missing_ok=True)
    with TrajectoryWriter(out) as w:
        w.write_many(chosen)
    return batch_shape(chosen)


def batch_shape(trajs: Sequence[Any]) -> dict[str, Any]:
    """Token counts of a batch: what a step's throughput is counted over."""
    lengths = [len(t) for t in trajs]
    actions = [t.num_actions for t in trajs]
    return {
        "trajectories": len(trajs),
        "groups": len({str(t.meta.get("group", t.task_id)) for t in trajs}),
        "tokens": int(sum(lengths)),
        "action_tokens": int(sum(actions)),
        "length_min": int(min(lengths)),
        "length_median": float(np.median(lengths)),
        "length_max": int(max(lengths)),
        "actions_median": float(np.median(actions)),
    }


def prefix_sharing_factor(trajs: Sequence[Any]) -> dict[str, Any]:
    """How much of a batch the prefix trie computes once: the tokens a forward needs (each
    trajectory up to its last action — what teacher-forcing reads) over the tokens of one
    trie over the whole batch (``train.packing.build_trie``, spans of at least
    ``MIN_SHARED`` tokens shared). 1.0: nothing shared."""
    from provrl.train.packing import MIN_SHARED, build_trie

    rows = []
    for t in trajs:
        acts = np.flatnonzero(t.is_action)
        if len(acts):
            rows.append(np.asarray(t.token_id[: int(acts[-1])]))
    needed = sum(len(r) for r in rows)
    trie = sum(length for _, _, length, _ in build_trie(rows, MIN_SHARED))
    return {"tokens": needed, "trie_tokens": trie, "factor": needed / max(trie, 1)}


def run_sharing_factors(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """:func:`prefix_sharing_factor` of each RL step's batch of a run (``RUN/rl/steps.jsonl``
    names the trajectories each step trained; ``RUN/rl/trajectories.jsonl`` holds them):
    the per-step factors and their median — what real batches share, beside the fixture."""
    from provrl.trajlog import read_all

    rl = Path(run_dir) / "rl"
    if not (rl / "steps.jsonl").is_file():
        raise FileNotFoundError(f"{rl / 'steps.jsonl'}: no RL step records (a provrl run dir?)")
    by_id = {t.traj_id: t for t in read_all(rl / "trajectories.jsonl")}
    steps = []
    for line in (rl / "steps.jsonl").read_text().splitlines():
        rec = json.loads(line)
        batch = [by_id[i] for i in rec.get("trained", []) if i in by_id]
        if batch:
            steps.append({"step": int(rec["step"]), "trajectories": len(batch),
                          **prefix_sharing_factor(batch)})  # fmt: skip
    if not steps:
        raise ValueError(f"{rl}: no step's trajectories found in its log")
    return {
        "run": str(run_dir),
        "steps": steps,
        "factor_median": float(statistics.median(x["factor"] for x in steps)),
        "factor_min": min(x["factor"] for x in steps),
        "factor_max": max(x["factor"] for x in steps),
    }


# ------------------------------------------------------------------------------ memory
def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_rss() -> None:
    """Reset the kernel's high-water mark VmHWM to the current RSS (Linux)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


# ------------------------------------------------------------------------------ the peak rate
def matmul_rate(threads: int) -> dict[str, Any]:
    """GFLOP/s of a matmul at :data:`MATMUL_SHAPES` in bf16 and fp32 on ``threads`` threads
    (the median call of :func:`provrl.bench.roofline.matmul_rates` per shape);
    ``bf16_gflops`` is the median over shapes."""
    import torch

    from provrl.bench.roofline import matmul_rates, roofline

    if threads:
        torch.set_num_threads(threads)
    out: dict[str, Any] = {"threads": torch.get_num_threads(), "shapes": []}
    for dtype, key in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        rates = []
        for m, k, n in MATMUL_SHAPES:
            rate = roofline(matmul_rates(m, k, n, dtype=dtype))["median"]
            rates.append(rate)
            out["shapes"].append({"dtype": key, "mkn": [m, k, n], "gflops": round(rate, 1)})
        out[f"{key}_gflops"] = round(statistics.median(rates), 1)
    return out


# ------------------------------------------------------------------------------ the sides
@dataclass
class SideSpec:
    """What one child process runs."""

    side: str
    model: str
    fixture: str
    threads: int
    rl_overrides: dict[str, Any]
    reference_micro_batch: int = 4
    count_flops: bool = True
    pin_allocator: bool = True
    """Pin glibc's mmap threshold (:func:`provrl._sys.pin_mmap_threshold`): the memory
    children, whose peak must repeat. The timing children run with glibc's defaults, as the
    RL loop does: pinned at 128 KiB every activation-sized tensor is a fresh ``mmap`` whose
    pages fault in again, and every side's step ran slower than in a run (docs/perf.md
    compares the pinned record with the unpinned one)."""


def _rl_config(overrides: dict[str, Any]) -> Any:
    """The default preset's ``rl`` section with ``overrides`` (``{"micro_batch_size": 8}``)."""
    from provrl.config import load_config
    from provrl.run_config import RunConfig

    sets = [
        f"rl.{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in overrides.items()
    ]
    return load_config(RunConfig, "default", sets).rl


class ReferenceStep:
    """A GRPO step written the way TRL's ``GRPOTrainer`` computes it (see module docstring).

    Per micro-batch of ``micro`` trajectories (in batch order): prompt = the tokens before the
    first action, completion = the rest (tool results inside it are masked out of the loss,
    as TRL's multi-turn tool masks do); prompts are left-padded and completions right-padded.
    The loss is −min(r A, clip(r, 1 ± 0.2) A) token-averaged over the batch with r = exp(log π
    − log π.detach()) (``num_iterations = 1``), A the group-normalised advantage (TRL's ε =
    ``adv_eps``). Then ``clip_grad_norm_(1.0)`` and one AdamW step. Two arms:

    * ``plain=False`` (``reference``): the model returns logits for the last ``C + 1``
      positions (``logits_to_keep``: every completion position, tool results included) and
      log-probabilities are the selected full log-softmax at temperature τ; torch's default
      AdamW;
    * ``plain=True`` (``reference_plain``): the plainest fast TRL-style step — the LM head only
      at the positions that predict an action, log π = z_a − logsumexp(z) (no [·, V]
      log-softmax kept), fused AdamW.

    Both run under ``autocast`` (bf16 as TRL on CPU; float32 to compare gradients exactly)."""

    def __init__(
        self,
        model: Any,
        pad_token_id: int,
        micro: int = 4,
        lr: float = 1e-5,
        *,
        plain: bool = False,
        autocast: str = "bfloat16",
        adv_eps: float = 1e-4,
    ) -> None:
        import torch

        self.model, self.pad, self.micro, self.plain = model, pad_token_id, micro, plain
        self.dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[autocast]
        self.adv_eps = adv_eps
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, fused=plain or None)

    def step(self, trajs: Sequence[Any]) -> dict[str, float]:
        import torch

        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_and_grad(trajs)
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.optimizer.step()
        return {"step_s": time.perf_counter() - t0, "loss": loss}

    def loss_and_grad(self, trajs: Sequence[Any]) -> float:
        """The batch's loss; its gradient accumulated into the parameters' ``.grad``."""
        import torch

        from provrl.objectives import advantages as adv_fns

        groups: dict[str, int] = {}
        gid = torch.tensor([groups.setdefault(str(t.meta.get("group", t.task_id)), len(groups)) for t in trajs])  # fmt: skip
        rewards = torch.tensor([float(t.reward) for t in trajs], dtype=torch.float64)
        adv = adv_fns.group_advantages(rewards, gid, std_normalise=True, eps=self.adv_eps).float()
        n_tokens = sum(int(t.is_action.sum()) for t in trajs)
        total = 0.0
        for s in range(0, len(trajs), self.micro):
            rows = list(range(s, min(s + self.micro, len(trajs))))
            ids, attn, comp, cmask, C = self._pad([trajs[i] for i in rows])
            tau = float(trajs[rows[0]].sampling.temperature or 1.0)
            logp = (self._plain_logp if self.plain else self._logp)(ids, attn, comp, cmask, C, tau)
            ratio = torch.exp(logp - logp.detach())
            a = adv[rows][:, None].expand_as(cmask)[cmask > 0] if self.plain else adv[rows][:, None]
            per_token = -torch.min(ratio * a, torch.clamp(ratio, 0.8, 1.2) * a)
            loss = (per_token if self.plain else per_token * cmask).sum() / n_tokens
            loss.backward()
            total += float(loss.detach())
        return total

    def _logp(self, ids: Any, attn: Any, comp: Any, cmask: Any, C: int, tau: float) -> Any:
        """[b, C] log π of every completion token: logits at the last C + 1 positions, full
        log-softmax."""
        import torch

        with self._autocast():
            logits = self.model(input_ids=ids, attention_mask=attn, logits_to_keep=C + 1).logits
        logits = logits[:, :-1].float() / tau
        return torch.gather(logits.log_softmax(-1), -1, comp[..., None]).squeeze(-1)

    def _plain_logp(self, ids: Any, attn: Any, comp: Any, cmask: Any, C: int, tau: float) -> Any:
        """[n] log π of the action tokens only (row-major): the LM head at the positions that
        predict them, log π = z_a − logsumexp(z)."""

        P = ids.shape[1] - C
        body = self.model.get_decoder()
        with self._autocast():
            hidden = body(input_ids=ids, attention_mask=attn).last_hidden_state
            at = cmask > 0  # [b, C]: completion position j is predicted by position P + j − 1
            h = hidden[:, P - 1 : P - 1 + C][at]
            z = self.model.get_output_embeddings()(h)
        z = z.float() / tau
        return z.gather(-1, comp[at][:, None]).squeeze(-1) - z.logsumexp(-1)

    def _autocast(self) -> Any:
        import torch

        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast("cpu", self.dtype)

    def _pad(self, trajs: Sequence[Any]) -> tuple[Any, Any, Any, Any, int]:
        """Left-padded prompts + right-padded completions; completion ids and loss mask."""
        import torch

        starts = [int(np.flatnonzero(t.is_action)[0]) for t in trajs]
        P = max(starts)
        C = max(len(t) - s for t, s in zip(trajs, starts, strict=True))
        ids = torch.full((len(trajs), P + C), self.pad, dtype=torch.long)
        attn = torch.zeros(len(trajs), P + C, dtype=torch.long)
        cmask = torch.zeros(len(trajs), C)
        for b, (t, s) in enumerate(zip(trajs, starts, strict=True)):
            tok = torch.from_numpy(t.token_id.astype(np.int64))
            ids[b, P - s : P] = tok[:s]
            ids[b, P : P + len(t) - s] = tok[s:]
            attn[b, P - s : P + len(t) - s] = 1
            cmask[b, : len(t) - s] = torch.from_numpy(t.is_action[s:].astype(np.float32))
        return ids, attn, ids[:, P:], cmask, C


def _build(spec: SideSpec, lm: Any) -> tuple[Callable[[Sequence[Any]], Any], Any, Any]:
    """(step function, optimizer, trainer-or-None) of ``spec.side`` over ``lm``."""
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    if spec.side in REFERENCES:
        from provrl.models.precision import resolve_dtype

        # the compute dtype provrl's side gets from the same preset (auto: this CPU's fast one)
        autocast = resolve_dtype(_rl_config(spec.rl_overrides).autocast, "cpu")
        ref = ReferenceStep(lm.model, pad, spec.reference_micro_batch, plain=REFERENCES[spec.side], autocast=autocast)  # fmt: skip
        return ref.step, ref.optimizer, None
    if spec.side in VARIANTS:
        from provrl.train.rl import RLTrainer

        cfg = _rl_config({**spec.rl_overrides, **VARIANTS[spec.side]})
        trainer = RLTrainer(lm.model, cfg, pad_token_id=pad, tokenizer=None)
        return trainer.step, trainer.optimizer, trainer
    raise ValueError(f"unknown side {spec.side!r}: expected one of {SIDES}")


def run_side(spec: SideSpec) -> dict[str, Any]:
    """One child: pin glibc's mmap threshold (:func:`provrl._sys.pin_mmap_threshold`), load,
    warm up (FLOPs counted), return freed heap to the OS, reset the
    peak, time one step. The memory breakdown: ``runtime`` is what the process holds before
    the timed step besides the model's state (interpreter, libraries, tokenizer, kernel
    caches); weights, gradients and optimizer state are their tensors' sizes; activations
    the peak bytes autograd held for backward; logits one LM-head chunk's transient float32
    tensors; ``published`` the state-dict copy a step hands to the engines (made after the
    backward, so the peak holds the larger of it and activations + logits). What the parts
    do not explain at the peak is ``unexplained`` (temporaries outside autograd's saved
    tensors, allocator fragmentation)."""
    import torch

    from provrl._sys import MMAP_THRESHOLD, pin_mmap_threshold, release_memory
    from provrl.models import load_model
    from provrl.train.memory import LM_HEAD_BYTES, SavedTensorMeter, optimizer_mib, tensor_mib

    # the peak must not depend on the allocator's history (memory children only: SideSpec)
    pinned = pin_mmap_threshold() if spec.pin_allocator else False
    if spec.threads:
        torch.set_num_threads(spec.threads)
    lm = load_model(spec.model)
    trajs = load_batch(spec.fixture or None)
    step, optimizer, trainer = _build(spec, lm)
    flops = 0
    if spec.count_flops:
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter:
            step(trajs)
        flops = int(counter.get_total_flops())
    else:
        step(trajs)
    params = list(lm.model.parameters())
    meter = SavedTensorMeter(params)
    release_memory()
    before = _status_mib("VmRSS")
    reset_peak_rss()
    # the trainer meters its own activations (mem_activations_mib); the reference is metered here
    with meter.hooks() if trainer is None else contextlib.nullcontext():
        t0 = time.perf_counter()
        result = step(trajs)
        wall = time.perf_counter() - t0
    peak = _status_mib("VmHWM")
    shape = batch_shape(trajs)
    V = int(lm.model.get_output_embeddings().weight.shape[0])
    published = getattr(result, "state_dict", None)
    chunk = getattr(getattr(trainer, "cfg", None), "logprob_chunk_tokens", 0)
    if trainer is None:  # reference: [micro, C, V] logits as bf16, their float32 copy and
        # its /τ (2 + 4 + 4 bytes); the log-softmax autograd keeps is an activation (metered).
        # reference_plain: the same three copies at the micro-batch's action positions only
        m = spec.reference_micro_batch
        if REFERENCES[spec.side]:
            per = [int(t.is_action.sum()) for t in trajs]
            logits = max(sum(per[i : i + m]) for i in range(0, len(per), m)) * V * 10
        else:
            comp = [len(t) - int(np.flatnonzero(t.is_action)[0]) for t in trajs]
            logits = max(len(comp[i : i + m]) * (max(comp[i : i + m]) + 1) for i in range(0, len(comp), m)) * V * 10  # fmt: skip
    else:  # one checkpointed chunk at its peak in backward (train.memory.LM_HEAD_BYTES)
        logits = min(chunk, shape["action_tokens"]) * V * LM_HEAD_BYTES
    state = {
        "weights_mib": tensor_mib(params),
        "grads_mib": tensor_mib(p for p in params if p.requires_grad),
        "optimizer_mib": optimizer_mib(optimizer),
    }
    breakdown = {
        "runtime_mib": before - sum(state.values()),
        **state,
        "activations_mib": meter.peak / 2**20
        if trainer is None
        else float(result.metrics["mem_activations_mib"]),
        "logits_mib": logits / 2**20,
        "published_mib": tensor_mib(published.values()) if published else 0.0,
    }
    transient = max(breakdown["activations_mib"] + breakdown["logits_mib"], breakdown["published_mib"])  # fmt: skip
    breakdown["held_at_peak_mib"] = before + transient
    breakdown["unexplained_mib"] = peak - breakdown["held_at_peak_mib"]
    return {
        "side": spec.side,
        "step_s": wall,
        "tokens_per_s": shape["tokens"] / wall,
        "action_tokens_per_s": shape["action_tokens"] / wall,
        "matmul_flops": flops,
        "flops_per_s": flops / wall,
        "peak_rss_mib": peak,
        "memory": {k: round(v, 1) for k, v in breakdown.items()},
        "malloc_mmap_threshold": MMAP_THRESHOLD if pinned else None,
        "threads": torch.get_num_threads(),
        "trainer_metrics": {
            k: float(v)
            for k, v in (getattr(result, "metrics", None) or {}).items()
            if k
            in (
                "loss",
                "kl_q_pi_k3",
                "clip_frac",
                "grad_norm",
                "optimizer_steps",
                "num_forward_tokens",
            )
        },
    }


def _spawn(spec: SideSpec) -> dict[str, Any]:
    """Run :func:`run_side` in a fresh interpreter; its last stdout line is the JSON."""
    code = (
        "import json, sys\n"
        "from provrl.bench.trainer import SideSpec, run_side\n"
        "print(json.dumps(run_side(SideSpec(**json.loads(sys.argv[1])))))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(spec.__dict__)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"trainer bench side {spec.side!r} failed:\n{tail}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# ------------------------------------------------------------------------------ lag-0 mismatch
def lag0_mismatch(
    model: str,
    fixture: str,
    *,
    engine_dtypes: Sequence[str] = ("float32", "bfloat16"),
    autocasts: Sequence[str] = ("float32", "bfloat16"),
    turns_per_group: int = 8,
    new_tokens: int = 28,
    threads: int = 2,
) -> list[dict[str, Any]]:
    """Trainer–engine mismatch at lag 0, and the engine's generation rate, per engine dtype.

    The engine (at the trainer's own weights) samples ``new_tokens`` after each group's
    first-turn context, ``turns_per_group`` requests per group, all in flight at once
    (``generated_tokens_per_s``: their tokens over the wall time); the trainer then scores
    those tokens under each autocast. Mean and max |log π_θ − log q| and the k3 estimate of
    KL(q‖π_θ) = E_q[π/q − 1 − log(π/q)] per (engine dtype, trainer autocast)."""
    import torch

    from provrl.engine import LocalEngine
    from provrl.engine.config import EngineConfig
    from provrl.models import load_model
    from provrl.provenance import Identity, SamplingParams, TrajectoryBuilder
    from provrl.train.rl import RLTrainer, prepare_batch

    if threads:
        torch.set_num_threads(threads)
    lm = load_model(model)
    trajs = load_batch(fixture or None)
    seen: dict[str, Any] = {}
    for t in trajs:
        seen.setdefault(str(t.meta.get("group", t.task_id)), t)
    prompts = [t.token_id[: int(np.flatnonzero(t.is_action)[0])] for t in seen.values()]
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    n_req = len(prompts) * turns_per_group
    rows = []
    for edtype in engine_dtypes:
        ecfg = EngineConfig(max_seqs=n_req, max_context=2048, dtype=edtype, threads=threads)  # type: ignore[arg-type]
        engine = LocalEngine(lm, ecfg)
        jobs = []
        try:
            t0 = time.perf_counter()
            for i, p in enumerate(prompts):
                for j in range(turns_per_group):
                    params = SamplingParams(1.0, max_new_tokens=new_tokens, seed=i * 97 + j)
                    jobs.append((i, j, p, params, engine.submit(p.tolist(), params)))
            outs = [(i, j, p, params, fut.result()) for i, j, p, params, fut in jobs]
            wall = time.perf_counter() - t0
        finally:
            engine.close()
        sampled = []
        for i, j, p, params, out in outs:
            b = TrajectoryBuilder(f"lag0-{i}-{j}", f"g{i}", policy=Identity("bench"), sampling=params)  # fmt: skip
            b.add_prompt(p)
            b.add_sampled(out)
            sampled.append(b.build(reward=0.0))
        generated = sum(len(o[-1].token_ids) for o in outs)
        for ac in autocasts:
            cfg = _rl_config({"autocast": ac})
            trainer = RLTrainer(lm.model, cfg, pad_token_id=pad)
            batch, _ = prepare_batch(sampled, pad_token_id=pad, vocab_size=trainer.vocab_size, cfg=cfg.advantages)  # fmt: skip
            prox = trainer.proximal_pass(batch)
            m = batch.mask
            d = (prox.logprobs - batch.tb.behaviour_logprobs)[m].double()  # log π − log q
            rows.append(
                {
                    "engine_dtype": edtype,
                    "trainer_autocast": ac,
                    "tokens": int(m.sum()),
                    "generated_tokens_per_s": generated / wall,
                    "mean_abs_logp_diff": float(d.abs().mean()),
                    "max_abs_logp_diff": float(d.abs().max()),
                    "kl_q_pi_k3": float((torch.exp(d) - 1 - d).mean()),
                }
            )
            del trainer
    return rows


# ------------------------------------------------------------------------------ the benchmark
def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_trainer_benchmark(
    model: str = "smollm2-135m",
    fixture: str = "",
    repeats: int = 3,
    threads: int = 2,
    sides: Sequence[str] = SIDES,
    rl_overrides: dict[str, Any] | None = None,
    reference_micro_batch: int = 4,
    lag0: bool = True,
    baseline: str = "",
    sharing_run: str = "",
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The whole benchmark (module docstring); ``baseline``: a results JSON of an earlier run
    of this benchmark whose ``provrl`` tokens/s the new one is compared with; ``sharing_run``:
    a run directory whose RL steps' batches give the prefix-sharing factor of real batches."""
    say = progress or (lambda _msg: None)
    trajs = load_batch(fixture or None)
    shape = batch_shape(trajs)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    memory: dict[str, dict[str, Any]] = {}

    def child(side: str, *, count_flops: bool, pin_allocator: bool) -> dict[str, Any]:
        spec = SideSpec(side, model, fixture, threads, dict(rl_overrides or {}), reference_micro_batch, count_flops=count_flops, pin_allocator=pin_allocator)  # fmt: skip
        return _spawn(spec)

    for r in range(repeats):  # timing: glibc's allocator as a run has it (SideSpec.pin_allocator)
        for s in sides:
            say(f"repeat {r + 1}/{repeats}: {s}")
            runs[s].append(child(s, count_flops=r == 0, pin_allocator=False))
    for s in sides:  # memory: the allocator pinned, so that the peak repeats
        say(f"memory: {s}")
        memory[s] = child(s, count_flops=False, pin_allocator=True)
    say("matmul rate")
    rate = matmul_rate(threads)

    def med(side: str, key: str) -> float:
        return float(statistics.median(x[key] for x in runs[side]))

    per_side: dict[str, Any] = {}
    for s in sides:
        flops = runs[s][0]["matmul_flops"]
        step_s = med(s, "step_s")
        per_side[s] = {
            "step_s": step_s,
            "step_s_all": [x["step_s"] for x in runs[s]],
            "tokens_per_s": shape["tokens"] / step_s,
            "action_tokens_per_s": shape["action_tokens"] / step_s,
            "matmul_flops": flops,
            "flops_per_s": flops / step_s,
            "roofline_fraction": flops / step_s / (rate["bf16_gflops"] * 1e9),
            "peak_rss_mib": memory[s]["peak_rss_mib"],
            "peak_rss_mib_timed": [x["peak_rss_mib"] for x in runs[s]],
            "memory": memory[s]["memory"],
            "memory_step_s": memory[s]["step_s"],
            "trainer_metrics": runs[s][-1]["trainer_metrics"],
        }
    out: dict[str, Any] = {
        "benchmark": "trainer",
        "commit": _git_commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "load_average_1m": os.getloadavg()[0]},
        "model": model,
        "fixture": str(fixture or FIXTURE.name),
        "batch": shape,
        "repeats": repeats,
        "threads": threads,
        "rl_config": _rl_config(dict(rl_overrides or {})).model_dump(mode="json"),
        "matmul": rate,
        "sides": per_side,
    }
    out["prefix_sharing_factor"] = {"fixture": prefix_sharing_factor(trajs)["factor"]}
    if "provrl" in per_side and per_side["provrl"]["trainer_metrics"].get("num_forward_tokens"):
        forward = per_side["provrl"]["trainer_metrics"]["num_forward_tokens"]
        out["prefix_sharing_factor"]["fixture_step"] = shape["tokens"] / forward
    if sharing_run:
        real = run_sharing_factors(sharing_run)
        out["prefix_sharing_factor"]["real_run"] = real["factor_median"]
        out["sharing_run"] = real
    refs = [r for r in REFERENCES if r in per_side]
    fastest = min(refs, key=lambda r: per_side[r]["step_s"]) if refs else None
    if "provrl_rows" in per_side and fastest:
        out["speedup_without_sharing"] = (
            per_side[fastest]["step_s"] / per_side["provrl_rows"]["step_s"]
        )
    if "provrl" in per_side:
        p = per_side["provrl"]
        out |= {
            "tokens_per_s": p["tokens_per_s"],
            "action_tokens_per_s": p["action_tokens_per_s"],
            "peak_rss_mib": p["peak_rss_mib"],
            "roofline_fraction": p["roofline_fraction"],
        }
        if fastest:
            # against the faster reference arm: ratio of medians of the interleaved repeats,
            # and the median of per-repeat ratios
            ref = per_side[fastest]
            out["reference_arm"] = fastest
            out["speedup_vs_reference"] = ref["step_s"] / p["step_s"]
            out["speedup_vs_reference_per_repeat"] = statistics.median(
                a["step_s"] / b["step_s"]
                for a, b in zip(runs[fastest], runs["provrl"], strict=True)
            )
            out["speedup_vs_each_reference"] = {
                r: per_side[r]["step_s"] / p["step_s"] for r in refs
            }
            out["memory_ratio_vs_reference"] = p["peak_rss_mib"] / ref["peak_rss_mib"]
        if baseline:
            base = json.loads(Path(baseline).read_text())
            out["baseline"] = {
                "file": str(baseline),
                "commit": base.get("commit"),
                "tokens_per_s": base["tokens_per_s"],
                "peak_rss_mib": base["peak_rss_mib"],
            }
            out["tokens_per_s_vs_baseline"] = p["tokens_per_s"] / base["tokens_per_s"]
            out["peak_rss_vs_baseline"] = p["peak_rss_mib"] / base["peak_rss_mib"]
    if lag0:
        say("lag-0 trainer-engine mismatch")
        out["lag0"] = lag0_mismatch(model, fixture, threads=threads)
    return out
