"""Per-token provenance: which policy generated this token, and with what probability.

Every token of a trajectory carries (docs/provenance.md):

==============  ==========================================================================
field           meaning
==============  ==========================================================================
token_id        the id the engine consumed or produced (never re-tokenized)
is_action       sampled by the policy (True) or written by prompt / tool / template (False)
version         policy version v_t of the weights that computed the sampling distribution
logprob         log q_{v_t}(a_t | h_t) under the distribution actually sampled from
                (after temperature, top-k, top-p, renormalised)
kept_mass       probability mass the sampler kept before renormalising (1.0 = no truncation)
kv_min, kv_max  oldest / newest weight version in the KV cache this token attended to
replica         engine replica that produced the token
==============  ==========================================================================

Non-action tokens carry none of the action fields: ``version = kv_min = kv_max = replica =
NO_VERSION`` and ``logprob = kept_mass = NaN``.

An engine that cannot know a field records it as *unknown*, never a guess: ``kept_mass =
NaN`` on an action token (e.g. vLLM with top-k / top-p truncation: it returns the
renormalised log q but not the mass it cut) and ``kv_min = UNKNOWN_VERSION`` (the oldest
KV version is unknown, e.g. vLLM prefilled the prompt across a hot-load). ``version``,
``logprob``, ``kv_max`` and ``replica`` are never unknown. Diagnostics count unknowns
separately instead of reading them as values (docs/engine.md §10 lists, per backend, which
fields are exact).

With these the trajectory behaviour probability is exact::

    log q(τ | x) = Σ_{t ∈ actions} log q_{v_t}(a_t | h_t)
    log w(τ)     = Σ_{t ∈ actions} [log π_θ(a_t | h_t) − log q_{v_t}(a_t | h_t)]

both computed in log space (float64 accumulation), never as products of probabilities.

The per-token fields are NumPy arrays (structure of arrays), so training code reads them
without Python loops over tokens; :class:`TrajectoryBatch` pads a list of trajectories into
torch tensors. :class:`TrajectoryBuilder` is how the engine and agent loop assemble one.

Why one module of ~600 lines: the record, its validation, its builder and its batching are
one contract — every invariant :meth:`Trajectory.validate` checks is one the builder
enforces and the batch relies on — kept in one file so the four cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch

NO_VERSION = -1
"""Sentinel for 'no version / no replica' on non-action tokens."""
UNKNOWN_VERSION = -2
"""Sentinel for ``kv_min`` of an action token whose oldest KV version the engine cannot
know (it is then only known to be ≤ ``kv_max``); ``kept_mass`` unknown is NaN."""

SegmentKind = Literal["prompt", "action", "observation", "template"]

# Per-token columns: name -> dtype. The order is the on-disk order.
TOKEN_COLUMNS: dict[str, np.dtype[Any]] = {
    "token_id": np.dtype("<i4"),
    "is_action": np.dtype("bool"),
    "version": np.dtype("<i4"),
    "logprob": np.dtype("<f4"),
    "kept_mass": np.dtype("<f4"),
    "kv_min": np.dtype("<i4"),
    "kv_max": np.dtype("<i4"),
    "replica": np.dtype("<i4"),
}


class ProvenanceError(ValueError):
    """A trajectory violates the provenance invariant. The message names the trajectory
    and, for per-token rules, the first offending token index."""


@dataclass(frozen=True)
class SamplingParams:
    """The sampling distribution's parameters — part of the behaviour policy's identity.

    ``temperature == 0`` means greedy decoding (then q puts mass 1 on the argmax and the
    recorded logprob is 0)."""

    temperature: float = 1.0
    """Softmax temperature τ: q ∝ exp(logits / τ). 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose mass reaches top_p."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 disables."""
    max_new_tokens: int = 256
    """Upper bound on sampled tokens for one generation call (one agent turn)."""
    stop: tuple[str, ...] = ()
    """Stop strings, matched on the decoded text generated in the current call."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end the generation call (the EOS id is added by the engine)."""
    seed: int | None = None
    """Seed for this request's sampler; None draws from the engine's generator."""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["stop"] = list(self.stop)
        d["stop_token_ids"] = list(self.stop_token_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingParams:
        d = dict(d)
        d["stop"] = tuple(d.get("stop", ()))
        d["stop_token_ids"] = tuple(d.get("stop_token_ids", ()))
        return cls(**d)


@dataclass(frozen=True)
class Identity:
    """Identity of a policy or a tool configuration, recorded with every trajectory and
    every filter decision (a task's verdict depends on both)."""

    name: str
    """Human name: a model name / checkpoint path, or a search backend name."""
    fingerprint: str = ""
    """Content hash of the weights or of the index + tool settings ('' if unknown)."""
    config: dict[str, Any] = field(default_factory=dict)
    """The settings that matter for behaviour (e.g. dtype, top-k of search, latency model)."""


@dataclass(frozen=True)
class Segment:
    """A contiguous span of tokens ``[start, end)`` with one role, within turn ``turn``."""

    kind: SegmentKind
    start: int
    end: int
    turn: int = 0


@dataclass(frozen=True)
class ToolCall:
    """One tool invocation parsed from the model's output in turn ``turn``."""

    turn: int
    name: str
    """Tool name (``search``, ``open``, ``answer``) or ``invalid`` for a malformed call."""
    arguments: str
    ok: bool = True
    error: str | None = None
    latency_s: float = 0.0


@dataclass
class Trajectory:
    """One rollout: token ids with per-token provenance plus per-trajectory metadata."""

    traj_id: str
    task_id: str
    token_id: np.ndarray
    is_action: np.ndarray
    version: np.ndarray
    logprob: np.ndarray
    kept_mass: np.ndarray
    kv_min: np.ndarray
    kv_max: np.ndarray
    replica: np.ndarray
    segments: list[Segment] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    """Scalar outcomes: exact_match, f1, num_tool_calls, … (written by the environment)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Wall-clock seconds: generation, tools, total, …"""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    policy: Identity = field(default_factory=lambda: Identity("unknown"))
    tools: Identity = field(default_factory=lambda: Identity("none"))
    meta: dict[str, Any] = field(default_factory=dict)
    """Free-form extras (prompt text, answer text, …); never read by training code."""

    @classmethod
    def from_columns(
        cls, traj_id: str, task_id: str, columns: Mapping[str, np.ndarray], **metadata: Any
    ) -> Trajectory:
        """Build from the per-token columns (a mapping with every name in TOKEN_COLUMNS)."""
        missing = set(TOKEN_COLUMNS) - set(columns)
        if missing:
            raise ProvenanceError(f"trajectory {traj_id!r}: missing columns {sorted(missing)}")
        cols: dict[str, Any] = {name: columns[name] for name in TOKEN_COLUMNS}
        return cls(traj_id, task_id, **cols, **metadata)

    # ---------------------------------------------------------------- basic shape
    def __len__(self) -> int:
        return int(self.token_id.shape[0])

    @property
    def num_actions(self) -> int:
        return int(self.is_action.sum())

    def columns(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in TOKEN_COLUMNS}

    # ---------------------------------------------------------------- validation
    def validate_metadata(self) -> Trajectory:
        """Check the per-trajectory fields' types: ids are strings, ``reward`` is None or a
        finite real number, ``metrics`` / ``timings`` map names to numbers (None stands for
        a NaN that went through JSON), segments and tool calls are what they claim. Raises
        :class:`ProvenanceError` naming the trajectory and the field."""
        where = f"trajectory {self.traj_id!r} (task {self.task_id!r})"
        if not isinstance(self.traj_id, str) or not isinstance(self.task_id, str):
            raise ProvenanceError(f"{where}: traj_id and task_id must be strings")
        r = self.reward
        if r is not None and (not _is_real(r) or not math.isfinite(r)):
            raise ProvenanceError(f"{where}: field 'reward' must be a finite number, got {r!r}")
        for name in ("metrics", "timings"):
            d = getattr(self, name)
            if not isinstance(d, dict):
                raise ProvenanceError(f"{where}: field {name!r} must be a mapping")
            for k, v in d.items():
                if not isinstance(k, str) or not (v is None or _is_real(v)):
                    raise ProvenanceError(
                        f"{where}: field '{name}.{k}' must be a number, got {v!r}"
                    )
        if not isinstance(self.meta, dict):
            raise ProvenanceError(f"{where}: field 'meta' must be a mapping")
        for j, seg in enumerate(self.segments):
            ints = (seg.start, seg.end, seg.turn)
            if seg.kind not in _SEGMENT_KINDS or not all(_is_int(x) for x in ints):
                raise ProvenanceError(f"{where}: segment {j} is not (kind, start, end, turn)")
        for j, call in enumerate(self.tool_calls):
            if not (isinstance(call.name, str) and isinstance(call.arguments, str)):
                raise ProvenanceError(f"{where}: tool call {j}: name and arguments must be text")
        return self

    def validate(self) -> Trajectory:
        """Check the provenance invariant (and :meth:`validate_metadata`); raise
        :class:`ProvenanceError` naming the trajectory and the first offending token.
        Returns ``self`` for chaining."""
        self.validate_metadata()
        where = f"trajectory {self.traj_id!r} (task {self.task_id!r})"
        n = len(self.token_id)
        for name, dtype in TOKEN_COLUMNS.items():
            arr = getattr(self, name)
            if not isinstance(arr, np.ndarray) or arr.ndim != 1:
                raise ProvenanceError(f"{where}: field {name!r} must be a 1-D numpy array")
            if arr.shape[0] != n:
                raise ProvenanceError(
                    f"{where}: field {name!r} has {arr.shape[0]} entries, token_id has {n}"
                )
            if arr.dtype != dtype:
                raise ProvenanceError(f"{where}: field {name!r} has dtype {arr.dtype}, not {dtype}")

        def first(bad: np.ndarray, rule: str) -> None:
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ProvenanceError(f"{where}: token {i}: {rule}")

        first(self.token_id < 0, "negative token id")
        a, na = self.is_action, ~self.is_action
        with np.errstate(invalid="ignore"):
            first(a & (self.version < 0), "action token has no version")
            first(a & ~np.isfinite(self.logprob), "action token logprob is not finite")
            first(a & (self.logprob > 0), "action token logprob > 0")
            km = self.kept_mass
            first(
                a & ~(np.isnan(km) | ((km > 0) & (km <= 1))),
                "action token kept_mass outside (0, 1]",
            )
            first(
                a & (self.kv_min < 0) & (self.kv_min != UNKNOWN_VERSION),
                "action token has no kv_versions",
            )
            first(a & (self.kv_max < 0), "action token has no kv_max")
            first(a & (self.kv_min > self.kv_max), "kv_min > kv_max")
            first(a & (self.kv_max > self.version), "kv_max newer than the sampling version")
            first(a & (self.replica < 0), "action token has no replica")
            first(na & (self.version != NO_VERSION), "non-action token has a version")
            first(na & ~np.isnan(self.logprob), "non-action token has a logprob")
            first(na & ~np.isnan(self.kept_mass), "non-action token has a kept_mass")
            first(
                na & ((self.kv_min != NO_VERSION) | (self.kv_max != NO_VERSION)),
                "non-action token has kv_versions",
            )
            first(na & (self.replica != NO_VERSION), "non-action token has a replica")

        prev_end = 0
        for j, seg in enumerate(self.segments):
            if not (prev_end <= seg.start <= seg.end <= n):
                raise ProvenanceError(
                    f"{where}: segment {j} [{seg.start}, {seg.end}) out of order or out of range"
                )
            span = self.is_action[seg.start : seg.end]
            if seg.kind == "action" and not span.all():
                i = seg.start + int(np.flatnonzero(~span)[0])
                raise ProvenanceError(f"{where}: token {i}: non-action token in action segment {j}")
            if seg.kind != "action" and span.any():
                i = seg.start + int(np.flatnonzero(span)[0])
                raise ProvenanceError(f"{where}: token {i}: action token in {seg.kind} segment {j}")
            prev_end = seg.end
        return self

    # ---------------------------------------------------------------- accessors
    def action_mask(self) -> np.ndarray:
        """Boolean mask of action tokens (those that enter the importance ratio)."""
        return self.is_action

    def behaviour_logprobs(self, fill: float = 0.0) -> np.ndarray:
        """log q_{v_t}(a_t | h_t) per token as float64, ``fill`` on non-action tokens."""
        return np.where(self.is_action, self.logprob.astype(np.float64), fill)

    def versions(self) -> np.ndarray:
        """Sampling version per token (NO_VERSION on non-action tokens)."""
        return self.version

    def version_lag(self, current_version: int) -> np.ndarray:
        """current_version − v_t for each action token (how stale each action is)."""
        return current_version - self.version[self.is_action]

    def log_q(self) -> float:
        """log q(τ|x) = Σ_{t∈actions} log q_{v_t}(a_t|h_t), accumulated in float64."""
        return float(self.logprob[self.is_action].astype(np.float64).sum())

    def log_w(self, target_logprobs: np.ndarray | Sequence[float]) -> float:
        """log w(τ) = Σ_{t∈actions} [log π_θ(a_t|h_t) − log q_{v_t}(a_t|h_t)].

        ``target_logprobs`` is log π_θ for every token (length ``len(self)``; values on
        non-action tokens are ignored) or for the action tokens only (length
        ``num_actions``). A target of −inf (π_θ(a_t|h_t) = 0) makes the whole product 0:
        the result is −inf, exactly. A NaN or +inf target is not a log-probability and
        raises :class:`ProvenanceError` naming the token (it used to return NaN)."""
        target = np.asarray(target_logprobs, dtype=np.float64)
        positions = np.flatnonzero(self.is_action)
        if target.shape == (len(self),):
            target = target[self.is_action]
        elif target.shape != (self.num_actions,):
            raise ProvenanceError(
                f"trajectory {self.traj_id!r}: target_logprobs has shape {target.shape}; "
                f"expected ({len(self)},) or ({self.num_actions},)"
            )
        bad = np.isnan(target) | (target == np.inf)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise ProvenanceError(
                f"trajectory {self.traj_id!r}: token {int(positions[j])}: target logprob "
                f"{target[j]} is not a log-probability, so log w(τ) is undefined"
            )
        behaviour = self.logprob[self.is_action].astype(np.float64)
        return float((target - behaviour).sum())

    def text_segments(self) -> Iterable[tuple[Segment, np.ndarray]]:
        for seg in self.segments:
            yield seg, self.token_id[seg.start : seg.end]

    # ---------------------------------------------------------------- equality
    def equals(self, other: Trajectory) -> bool:
        """Bit-for-bit equality of every field (NaNs compare equal by bit pattern)."""
        for name in TOKEN_COLUMNS:
            x, y = getattr(self, name), getattr(other, name)
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                return False
        meta_self = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        meta_other = {f.name: getattr(other, f.name) for f in dataclasses.fields(other)}
        for name in TOKEN_COLUMNS:
            meta_self.pop(name), meta_other.pop(name)
        return _nan_equal(meta_self, meta_other)


_SEGMENT_KINDS = frozenset(SegmentKind.__args__)  # type: ignore[attr-defined]


def _is_real(x: Any) -> bool:
    """An int or float that is not a bool (JSON numbers; ``True`` is not a reward)."""
    return isinstance(x, int | float | np.integer | np.floating) and not isinstance(
        x, bool | np.bool_
    )


def _is_int(x: Any) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool | np.bool_)


def _nan_equal(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_nan_equal(x[k], y[k]) for k in x)
    if isinstance(x, list | tuple) and isinstance(y, list | tuple):
        return len(x) == len(y) and all(_nan_equal(a, b) for a, b in zip(x, y, strict=True))
    if dataclasses.is_dataclass(x) and dataclasses.is_dataclass(y):
        return type(x) is type(y) and _nan_equal(
            {f.name: getattr(x, f.name) for f in dataclasses.fields(x)},
            {f.name: getattr(y, f.name) for f in dataclasses.fields(y)},
        )
    return bool(x == y)


# ------------------------------------------------------------------------- building
class SampledTokens(Protocol):
    """What an engine returns for one generation call (``provrl.engine.TurnOutput``): the
    sampled ids with their provenance, one entry per token (``replica`` for all of them)."""

    @property
    def token_ids(self) -> Sequence[int]: ...
    @property
    def logprob(self) -> np.ndarray: ...
    @property
    def kept_mass(self) -> np.ndarray: ...
    @property
    def version(self) -> np.ndarray: ...
    @property
    def kv_min(self) -> np.ndarray: ...
    @property
    def kv_max(self) -> np.ndarray: ...
    @property
    def replica(self) -> int: ...


class TrajectoryBuilder:
    """Assemble a trajectory chunk by chunk, as the agent loop sees it.

    >>> b = TrajectoryBuilder("t0", "task-1")
    >>> b.add_prompt([1, 2, 3])
    >>> b.add_actions([4, 5], logprob=[-0.1, -0.2], kept_mass=[1.0, 1.0], version=[0, 0],
    ...               kv_min=[0, 0], kv_max=[0, 0], replica=0)
    >>> len(b.build())
    5
    """

    def __init__(self, traj_id: str, task_id: str, **metadata: Any) -> None:
        self.traj_id = traj_id
        self.task_id = task_id
        self.metadata = metadata
        self._chunks: dict[str, list[np.ndarray]] = {name: [] for name in TOKEN_COLUMNS}
        self.segments: list[Segment] = []
        self.tool_calls: list[ToolCall] = []
        self.turn = 0
        self._len = 0

    def __len__(self) -> int:
        return self._len

    @property
    def num_actions(self) -> int:
        """Action tokens added so far."""
        return sum(int(chunk.sum()) for chunk in self._chunks["is_action"])

    @property
    def first_action_version(self) -> int | None:
        """The version that sampled the first action token added (None: no action yet)."""
        for act, ver in zip(self._chunks["is_action"], self._chunks["version"], strict=True):
            if act.any():
                return int(ver[np.argmax(act)])
        return None

    def _append(self, kind: SegmentKind, cols: dict[str, Any]) -> None:
        n = len(cols["token_id"])
        if n == 0:
            return
        for name, dtype in TOKEN_COLUMNS.items():
            arr = np.asarray(cols[name], dtype=dtype)
            if arr.shape == ():
                arr = np.full(n, arr, dtype=dtype)
            self._chunks[name].append(arr)
        last = self.segments[-1] if self.segments else None
        if (
            last is not None
            and last.kind == kind
            and last.turn == self.turn
            and last.end == self._len
        ):
            self.segments[-1] = Segment(kind, last.start, self._len + n, self.turn)
        else:
            self.segments.append(Segment(kind, self._len, self._len + n, self.turn))
        self._len += n

    def _add_non_action(self, kind: SegmentKind, token_ids: Sequence[int] | np.ndarray) -> None:
        ids = np.asarray(token_ids, dtype=TOKEN_COLUMNS["token_id"])
        nan, none = np.float32("nan"), NO_VERSION
        self._append(
            kind,
            {
                "token_id": ids,
                "is_action": np.zeros(len(ids), bool),
                "version": np.int32(none),
                "logprob": nan,
                "kept_mass": nan,
                "kv_min": np.int32(none),
                "kv_max": np.int32(none),
                "replica": np.int32(none),
            },
        )

    def add_prompt(self, token_ids: Sequence[int] | np.ndarray) -> None:
        self._add_non_action("prompt", token_ids)

    def add_observation(self, token_ids: Sequence[int] | np.ndarray) -> None:
        """Tool output (and the chat-template tokens around it): never actions."""
        self._add_non_action("observation", token_ids)

    def add_template(self, token_ids: Sequence[int] | np.ndarray) -> None:
        self._add_non_action("template", token_ids)

    def add_actions(
        self,
        token_ids: Sequence[int] | np.ndarray,
        *,
        logprob: Sequence[float] | np.ndarray,
        kept_mass: Sequence[float] | np.ndarray,
        version: Sequence[int] | np.ndarray | int,
        kv_min: Sequence[int] | np.ndarray | int,
        kv_max: Sequence[int] | np.ndarray | int,
        replica: Sequence[int] | np.ndarray | int,
    ) -> None:
        ids = np.asarray(token_ids, dtype=TOKEN_COLUMNS["token_id"])
        self._append(
            "action",
            {
                "token_id": ids,
                "is_action": np.ones(len(ids), bool),
                "version": np.asarray(version),
                "logprob": np.asarray(logprob),
                "kept_mass": np.asarray(kept_mass),
                "kv_min": np.asarray(kv_min),
                "kv_max": np.asarray(kv_max),
                "replica": np.asarray(replica),
            },
        )

    def add_sampled(self, out: SampledTokens) -> None:
        """Append one engine generation call's tokens as actions, provenance as recorded."""
        self.add_actions(
            out.token_ids,
            logprob=out.logprob,
            kept_mass=out.kept_mass,
            version=out.version,
            kv_min=out.kv_min,
            kv_max=out.kv_max,
            replica=out.replica,
        )

    def add_tool_call(self, call: ToolCall) -> None:
        self.tool_calls.append(call)

    def next_turn(self) -> None:
        self.turn += 1

    def token_ids(self) -> np.ndarray:
        """All token ids so far (what the engine's context holds)."""
        if not self._chunks["token_id"]:
            return np.zeros(0, TOKEN_COLUMNS["token_id"])
        return np.concatenate(self._chunks["token_id"])

    def build(self, validate: bool = True, **overrides: Any) -> Trajectory:
        cols: dict[str, Any] = {
            name: (np.concatenate(chunks) if chunks else np.zeros(0, TOKEN_COLUMNS[name]))
            for name, chunks in self._chunks.items()
        }
        kwargs: dict[str, Any] = {**self.metadata, **overrides}
        traj = Trajectory.from_columns(
            self.traj_id,
            self.task_id,
            cols,
            segments=list(self.segments),
            tool_calls=list(self.tool_calls),
            **kwargs,
        )
        return traj.validate() if validate else traj


# ------------------------------------------------------------------------- batching
@dataclass
class TrajectoryBatch:
    """Right-padded tensors for a list of trajectories, aligned per token.

    ``logprob[b, t]`` is log q(token t | tokens < t): the trainer compares it with
    ``log_softmax(logits[b, t-1])[input_ids[b, t]]``."""

    input_ids: torch.Tensor  # [B, T] int64
    attention_mask: torch.Tensor  # [B, T] bool
    action_mask: torch.Tensor  # [B, T] bool
    behaviour_logprobs: torch.Tensor  # [B, T] float32, 0 on non-actions and padding
    kept_mass: torch.Tensor  # [B, T] float32, 1 on non-actions and padding
    versions: torch.Tensor  # [B, T] int64, NO_VERSION on non-actions and padding
    lengths: torch.Tensor  # [B] int64
    rewards: torch.Tensor  # [B] float32 (NaN where a trajectory has no reward)

    @classmethod
    def from_trajectories(cls, trajs: Sequence[Trajectory], pad_token_id: int) -> TrajectoryBatch:
        import torch

        if not trajs:
            raise ValueError("cannot batch zero trajectories")
        lengths = np.array([len(t) for t in trajs], dtype=np.int64)
        B, T = len(trajs), int(lengths.max())
        ids = np.full((B, T), pad_token_id, np.int64)
        act = np.zeros((B, T), bool)
        lp = np.zeros((B, T), np.float32)
        km = np.ones((B, T), np.float32)
        ver = np.full((B, T), NO_VERSION, np.int64)
        for b, t in enumerate(trajs):
            n = len(t)
            ids[b, :n] = t.token_id
            act[b, :n] = t.is_action
            lp[b, :n] = np.where(t.is_action, t.logprob, 0.0)
            km[b, :n] = np.where(t.is_action, t.kept_mass, 1.0)
            ver[b, :n] = t.version
        attn = np.arange(T)[None, :] < lengths[:, None]
        rewards = np.array(
            [np.nan if t.reward is None else t.reward for t in trajs], dtype=np.float32
        )
        return cls(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(attn),
            action_mask=torch.from_numpy(act),
            behaviour_logprobs=torch.from_numpy(lp),
            kept_mass=torch.from_numpy(km),
            versions=torch.from_numpy(ver),
            lengths=torch.from_numpy(lengths),
            rewards=torch.from_numpy(rewards),
        )
