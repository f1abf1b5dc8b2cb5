"""Weight fingerprints: which tensors an engine really holds after a hot-load.

A fingerprint maps every HF parameter name to the SHA-256 of that tensor's bytes, cast to
the engine's dtype (plus its dtype and shape)::

    fp(W)[name] = sha256(dtype ‖ shape ‖ bytes(W[name].to(dtype)))
    digest(fp)  = sha256 of the sorted lines "name digest"

The publisher fingerprints the state dict it sends (:func:`fingerprint`); the engine
fingerprints the tensors it computes with (:meth:`LocalEngine.weights_fingerprint`). They
agree iff every tensor arrived bit for bit: one tensor a hot-load skipped, truncated or
left at its old value is named by :func:`mismatches`. The cast is the one the engine's own
copy performs (``Tensor.copy_`` rounds to nearest even), so a bf16 engine agrees with an
fp32 publisher.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch


def tensor_digest(t: torch.Tensor, dtype: torch.dtype | None = None) -> str:
    """sha256 over ``t``'s dtype, shape and bytes (after casting to ``dtype``), hex."""
    x = t.detach()
    if dtype is not None and x.dtype != dtype:
        x = x.to(dtype)
    x = x.cpu().contiguous()
    h = hashlib.sha256(f"{x.dtype}{tuple(x.shape)}".encode())
    h.update(x.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def fingerprint(
    tensors: Mapping[str, Any], dtype: torch.dtype | None = None, names: set[str] | None = None
) -> dict[str, str]:
    """name → :func:`tensor_digest` for every tensor of ``tensors`` (only ``names`` when
    given, e.g. the engine's parameter names: a tied ``lm_head`` is not one)."""
    return {
        k: tensor_digest(v, dtype)
        for k, v in sorted(tensors.items())
        if names is None or k in names
    }


def digest(fp: Mapping[str, str]) -> str:
    """One sha256 for a whole fingerprint (the sorted ``name digest`` lines)."""
    lines = "\n".join(f"{k} {v}" for k, v in sorted(fp.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def mismatches(expected: Mapping[str, str], got: Mapping[str, str]) -> list[str]:
    """Names whose digest differs or that only one side has, sorted."""
    return sorted(k for k in set(expected) | set(got) if expected.get(k) != got.get(k))
