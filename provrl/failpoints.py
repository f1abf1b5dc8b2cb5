"""Failpoints: deterministic crash injection for the resume tests.

``PROVRL_FAILPOINT=name[:n]`` makes the process SIGKILL itself the n-th time (default 1st)
execution reaches ``failpoint(name)`` — the same as ``kill -9`` from outside, but at an exact
place (e.g. between saving version v+1 and hot-loading it). Unset, a failpoint costs one
dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import threading

_hits: dict[str, int] = {}
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
