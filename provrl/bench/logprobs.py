"""``provrl bench logprobs``: the trainer's chunked logprobs against the full ``[B, T, V]``
log-softmax.

Both compute the same teacher-forced log π_θ(x_t|x_<t) (and its gradient) on the same batch;
the peer is :func:`provrl.train.logprobs.token_logprobs`, which materialises the full
log-softmax. Measured side by side:

* wall time of forward + backward, alternating the two methods, median of ``repeats``;
* peak resident memory of one forward + backward, and of one no-grad forward (the trainer's
  proximal pass), each in a fresh subprocess: the kernel's
  high-water mark ``VmHWM`` is reset (``/proc/self/clear_refs`` ← 5) after the model is
  loaded, and the result is VmHWM after the call minus VmRSS before it (Linux only).

``action_frac`` < 1 marks only the last fraction of each row as action tokens (the rest is
prompt / tool output): the chunked path computes the LM head only there, the full path
cannot skip anything.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

from provrl.models.loading import load_model
from provrl.train.logprobs import token_logprobs, token_logprobs_chunked

METHODS = ("full", "chunked")


def _inputs(vocab: int, batch: int, seq_len: int, action_frac: float, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq_len), generator=g)
    attn = torch.ones(batch, seq_len, dtype=torch.bool)
    act = torch.zeros(batch, seq_len, dtype=torch.bool)
    act[:, max(1, int(seq_len * (1 - action_frac))) :] = True
    return ids, attn, act


def _fwd_bwd(
    model: Any, method: str, ids, attn, act, chunk_tokens: int, backward: bool = True
) -> float:
    """One forward (+ backward) of the mean action-token NLL by ``method``."""
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(backward):
        if method == "full":
            lp = token_logprobs(model, ids, attn)
        else:
            lp = token_logprobs_chunked(
                model, ids, attn, positions=act, chunk_tokens=chunk_tokens
            ).logprobs
        loss = -(lp * act).sum() / act.sum()
    if backward:
        loss.backward()
    return float(loss.detach())


def _load(model_name: str) -> Any:
    return load_model(model_name).model


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _peak_rss_of_call(
    model: Any, method: str, ids, attn, act, chunk_tokens: int, backward: bool = True
) -> float:
    """MiB the process's resident set rose above its pre-call level during one call (after a
    warm-up call on 8 tokens, so one-off allocations of the first backward are not counted)."""
    warm_act = act[:1, -8:].clone()
    warm_act[:, 0] = False
    _fwd_bwd(model, method, ids[:1, -8:], attn[:1, -8:], warm_act, chunk_tokens, backward)
    model.zero_grad(set_to_none=True)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _status_kib("VmRSS")
    _fwd_bwd(model, method, ids, attn, act, chunk_tokens, backward)
    return (_status_kib("VmHWM") - before) / 1024


def measure_peak_rss(
    model_name: str,
    method: str,
    batch: int,
    seq_len: int,
    action_frac: float,
    chunk_tokens: int,
    backward: bool = True,
) -> float:
    """Peak RSS increase (MiB) of one forward (+ backward), in a fresh subprocess."""
    code = (
        "import json\n"
        "from provrl.bench import logprobs as bench\n"
        f"m = bench._load({model_name!r})\n"
        f"ids, attn, act = bench._inputs(m.config.vocab_size, {batch}, {seq_len}, {action_frac})\n"
        f"peak = bench._peak_rss_of_call(m, {method!r}, ids, attn, act, {chunk_tokens}, "
        f"{backward})\n"
        "print(json.dumps(peak))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    return float(json.loads(out.strip().splitlines()[-1]))


def run_logprob_benchmark(
    model_name: str = "smollm2-135m",
    batch: int = 2,
    seq_len: int = 256,
    action_frac: float = 0.5,
    chunk_tokens: int = 256,
    repeats: int = 3,
) -> dict[str, Any]:
    """Time and peak memory of the full vs chunked logprob paths (see module docstring)."""
    model = _load(model_name).train(False)
    ids, attn, act = _inputs(model.config.vocab_size, batch, seq_len, action_frac)
    _fwd_bwd(model, "chunked", ids, attn, act, chunk_tokens)  # warm-up
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    for _ in range(repeats):
        for method in METHODS:
            t0 = time.perf_counter()
            _fwd_bwd(model, method, ids, attn, act, chunk_tokens)
            times[method].append(time.perf_counter() - t0)
    rss = {
        m: measure_peak_rss(model_name, m, batch, seq_len, action_frac, chunk_tokens)
        for m in METHODS
    }
    rss_nograd = {
        m: measure_peak_rss(model_name, m, batch, seq_len, action_frac, chunk_tokens, False)
        for m in METHODS
    }
    full_s, chunk_s = statistics.median(times["full"]), statistics.median(times["chunked"])
    return {
        "model": model_name,
        "batch": batch,
        "seq_len": seq_len,
        "action_frac": action_frac,
        "chunk_tokens": chunk_tokens,
        "threads": torch.get_num_threads(),
        "full_s": round(full_s, 4),
        "chunked_s": round(chunk_s, 4),
        "time_ratio": round(chunk_s / full_s, 3),
        "full_peak_mib": round(rss["full"], 1),
        "chunked_peak_mib": round(rss["chunked"], 1),
        "memory_ratio": round(rss["chunked"] / rss["full"], 3),
        "full_nograd_peak_mib": round(rss_nograd["full"], 1),
        "chunked_nograd_peak_mib": round(rss_nograd["chunked"], 1),
        "nograd_memory_ratio": round(rss_nograd["chunked"] / rss_nograd["full"], 3),
        "full_logits_mib": round(batch * seq_len * model.config.vocab_size * 4 / 2**20, 1),
    }
