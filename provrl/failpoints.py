"""Failpoints and faults: deterministic crash and fault injection for the resume tests.

``PROVRL_FAILPOINT=name[:n]`` makes the process SIGKILL itself the n-th time (default 1st)
execution reaches ``failpoint(name)`` — the same as ``kill -9`` from outside, but at an exact
place (e.g. between saving version v+1 and hot-loading it).

``PROVRL_FAULT=name[:n]`` makes ``fault(name)`` return True the n-th time (default 1st) it
is reached, ``name:n+`` the n-th time and every time after: the caller then injects the
fault it names (``rl.nan_grad``: the trainer's gradient becomes NaN, as an overflow or a
poisoned batch makes it). Unset, each costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import threading

_hits: dict[str, int] = {}
_fault_hits: dict[str, int] = {}
_lock = threading.Lock()


def failpoint(name: str) -> None:
    spec = os.environ.get("PROVRL_FAILPOINT")
    if not spec:
        return
    target, _, n = spec.partition(":")
    if target != name:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        if _hits[name] >= int(n or 1):
            os.kill(os.getpid(), signal.SIGKILL)


def fault(name: str) -> bool:
    """Whether to inject the fault ``name`` now (``PROVRL_FAULT``, the module docstring)."""
    spec = os.environ.get("PROVRL_FAULT")
    if not spec:
        return False
    target, _, n = spec.partition(":")
    if target != name:
        return False
    every = n.endswith("+")
    at = int(n.removesuffix("+") or 1)
    with _lock:
        _fault_hits[name] = _fault_hits.get(name, 0) + 1
        hit = _fault_hits[name]
    return hit >= at if every else hit == at


def reset() -> None:
    """Forget how often each failpoint and fault was reached (tests in one process)."""
    with _lock:
        _hits.clear()
        _fault_hits.clear()
