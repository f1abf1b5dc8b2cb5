"""What a training step holds in memory, by part: weights, gradients, optimizer state and
the activations autograd keeps for backward.

:class:`SavedTensorMeter` counts the activations exactly: every tensor autograd saves for
backward passes through a saved-tensor hook (:func:`torch.autograd.graph.saved_tensors_hooks`),
counted once per storage while autograd holds it; parameters are excluded (they are the
weights). Its ``peak`` is the most bytes held at once — the activation share of a step's
peak resident memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

MIB = 2**20
LM_HEAD_BYTES = 20
"""Bytes per (action token × vocabulary entry) one activation-checkpointed LM-head chunk holds
at its peak in backward: the recomputed bf16 logits, their float32 copy and log-softmax
(2 + 4 + 4), then the float32 gradients of the log-softmax and of the logits and the bf16
cast the matmul's backward takes (4 + 4 + 2). ``mem_logits_mib`` is one chunk of it."""


def tensor_mib(tensors: Iterable[torch.Tensor]) -> float:
    """MiB of ``tensors`` (their elements; shared storages counted per tensor)."""
    return float(sum(t.numel() * t.element_size() for t in tensors)) / MIB


def optimizer_mib(optimizer: torch.optim.Optimizer | None) -> float:
    """MiB of an optimizer's state tensors (AdamW: exp_avg, exp_avg_sq, step)."""
    if optimizer is None:
        return 0.0
    return tensor_mib(
        v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)
    )


class SavedTensorMeter:
    """Bytes autograd holds for backward, counted once per storage (see module docstring).

    ::

        meter = SavedTensorMeter(model.parameters())
        with meter.hooks():
            loss = forward(); loss.backward()
        meter.peak  # bytes
    """

    def __init__(self, params: Iterable[torch.Tensor]) -> None:
        self.exclude = {p.untyped_storage().data_ptr() for p in params}
        self.live: dict[int, list[int]] = {}  # storage ptr -> [holders, bytes]
        self.bytes = 0
        self.peak = 0

    def reset(self) -> None:
        """Start a new peak (tensors still held keep counting)."""
        self.peak = self.bytes

    def pack(self, t: torch.Tensor) -> Any:
        s = t.untyped_storage()
        ptr = s.data_ptr()
        if ptr in self.exclude or s.nbytes() == 0:
            return t
        return _Held(self, t, ptr, s.nbytes())

    @staticmethod
    def unpack(x: Any) -> torch.Tensor:
        return x.t if isinstance(x, _Held) else x

    def hooks(self) -> Any:
        """The context manager that routes saved tensors through this meter."""
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


class _Held:
    """One saved tensor; the count drops when autograd lets go of its storage's last holder."""

    __slots__ = ("meter", "ptr", "t")

    def __init__(self, meter: SavedTensorMeter, t: torch.Tensor, ptr: int, nbytes: int) -> None:
        self.meter, self.t, self.ptr = meter, t, ptr
        entry = meter.live.setdefault(ptr, [0, nbytes])
        if entry[0] == 0:
            meter.bytes += nbytes
            meter.peak = max(meter.peak, meter.bytes)
        entry[0] += 1

    def __del__(self) -> None:
        entry = self.meter.live.get(self.ptr)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.meter.bytes -= entry[1]
            del self.meter.live[self.ptr]


def step_memory(
    params: Sequence[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer | None,
    meter: SavedTensorMeter,
    published: dict[str, torch.Tensor] | None = None,
    logits_bytes: int = 0,
) -> dict[str, float]:
    """The ``mem_*_mib`` metrics of one step: weights, gradients (the size they take when
    present), optimizer state, peak activations, the LM-head logits of one chunk (an
    estimate: logits, log-softmax and exp in float32) and the published state-dict copy."""
    return {
        "mem_weights_mib": tensor_mib(params),
        "mem_grads_mib": tensor_mib(p for p in params if p.requires_grad),
        "mem_optimizer_mib": optimizer_mib(optimizer),
        "mem_activations_mib": meter.peak / MIB,
        "mem_logits_mib": logits_bytes / MIB,
        "mem_published_mib": tensor_mib(published.values()) if published else 0.0,
    }
