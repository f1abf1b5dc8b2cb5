"""Weights across processes: a state dict as numpy arrays, published once per version.

A torch tensor pickles through a byte copy; a numpy array travels through Ray's object
store without one — a replica on the same node maps the published arrays read-only
straight from shared memory, and the engine copies them once, into its own fused layout,
at the swap. bfloat16 has no numpy dtype: it travels as its int16 bit pattern.

:class:`WeightStore` holds the newest published version (one ``ray.put`` per version,
whatever the number of replicas); a replica that restarts loads exactly that version.
:class:`WeightTransport` is the seam for other transports (NCCL broadcast between GPU
replicas, docs/distributed.md), which would publish the same way and hand replicas a
handle instead of an object-store reference.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from provrl.engine.api import EngineError

# torch dtypes without a numpy equivalent travel as same-width integer bit patterns
_BITS = {torch.bfloat16: torch.int16}


@dataclass
class PackedWeights:
    """A state dict as ``name → numpy array`` plus each tensor's torch dtype name."""

    arrays: dict[str, np.ndarray]
    dtypes: dict[str, str]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def pack_state_dict(state_dict: Mapping[str, Any]) -> PackedWeights:
    """Tensors → numpy arrays sharing their memory (bfloat16 as its int16 bits)."""
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    for name, t in state_dict.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"state dict entry {name!r} is a {type(t).__name__}, not a tensor")
        t = t.detach().cpu().contiguous()
        dtypes[name] = str(t.dtype).removeprefix("torch.")
        arrays[name] = (t.view(_BITS[t.dtype]) if t.dtype in _BITS else t).numpy()
    return PackedWeights(arrays, dtypes)


def unpack_state_dict(packed: PackedWeights) -> dict[str, torch.Tensor]:
    """numpy arrays → tensors over the same memory (read-only object-store memory is fine:
    the engine only reads them, to copy into its own weights)."""
    out: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, a in packed.arrays.items():
            t = torch.from_numpy(a)
            dtype = getattr(torch, packed.dtypes[name])
            out[name] = t.view(dtype) if dtype in _BITS else t
    return out


@dataclass(frozen=True)
class Published:
    """A version some other process already put in the object store (the trainer actor's
    packed weights, :mod:`provrl.distributed.trainer`): ``RayEngine.load_weights`` takes it
    in place of a state dict and hands the reference to the replicas as it is."""

    ref: Any
    """The ObjectRef of a :class:`PackedWeights`."""
    nbytes: int
    """Its size (for the published-bytes counter)."""


class WeightTransport(Protocol):
    """How a version's weights reach the replicas: published once, fetched by each."""

    def publish(self, state_dict: Mapping[str, Any], version: int) -> Any:
        """Make ``state_dict`` available as ``version``; returns the handle replicas get."""
        ...

    def latest(self) -> tuple[int, Any]:
        """The newest published (version, handle); handle None = the initial weights."""
        ...


class WeightStore:
    """The object-store transport: one ``ray.put`` of the packed state dict per version.

    Only the newest version is referenced (older ones are freed once no replica holds
    them); ``latest()`` is what a restarting replica loads."""

    def __init__(self, version: int) -> None:
        self._lock = threading.Lock()
        self._version = version
        self._ref: Any = None
        self.published = 0
        self.published_bytes = 0

    def publish(self, state_dict: Mapping[str, Any], version: int) -> Any:
        import ray

        with self._lock:
            current = self._current(version)
        if current is not None:
            return current  # already published: once per version
        packed = pack_state_dict(state_dict)
        return self.adopt(Published(ray.put(packed), packed.nbytes), version)

    def adopt(self, published: Published, version: int) -> Any:
        """Make an already published :class:`Published` the newest version (no copy)."""
        with self._lock:
            current = self._current(version, published.ref)
            if current is not None:
                return current
            self._version, self._ref = version, published.ref
            self.published += 1
            self.published_bytes += published.nbytes
        return published.ref

    def _current(self, version: int, ref: Any = None) -> Any:
        """None when ``version`` is newer than the store's; the stored reference when it is
        the store's version already (and, given ``ref``, that same object); else raise."""
        if version > self._version:
            return None
        if version == self._version and self._ref is not None and (ref is None or ref is self._ref):
            return self._ref

        raise EngineError(
            f"load_weights: version {version} must be newer than version {self._version}"
        )

    def latest(self) -> tuple[int, Any]:
        with self._lock:
            return self._version, self._ref
