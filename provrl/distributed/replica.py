"""One engine replica in its own process: the engine ``engine.backend`` names (a
:class:`~provrl.engine.LocalEngine`, or vLLM, via :func:`provrl.engine.make_engine`) behind
the methods of an async Ray actor.

Each generation call is one actor call that returns when the turn ends, so the actor holds
as many calls as there are turns in flight (an async actor: one event loop awaiting the
engine's futures; the engine's scheduler thread does the work). ``load_weights`` runs off
the event loop, so a ``drain`` hot-load never blocks the delivery of the turns it waits
for. ``wait_forever`` never returns: the client keeps one such call open and learns of the
replica's death the moment Ray fails it.

The class is plain Python; :class:`provrl.distributed.engine.RayEngine` makes it a Ray
actor with the replica's resources.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from provrl.distributed.weights import PackedWeights, unpack_state_dict
from provrl.engine.api import EngineError, HotLoadMode, HotLoadReport, TurnOutput
from provrl.engine.config import EngineConfig
from provrl.engine.factory import make_engine
from provrl.models.loading import LoadedModel
from provrl.provenance import SamplingParams


class EngineReplica:
    """An engine in a Ray actor process (see the module docstring)."""

    def __init__(
        self,
        lm: LoadedModel,
        engine_cfg: dict[str, Any],
        replica: int,
        version: int,
        weights: PackedWeights | None = None,
        weights_version: int | None = None,
    ) -> None:
        """``lm``: the LoadedModel (Ray resolves the object-store reference; its weights
        are ``version``). ``weights``: a newer published version to start from — what a
        restarted replica loads before it serves a single token."""
        self.replica = replica
        self.engine = make_engine(lm, EngineConfig(**engine_cfg), replica=replica, version=version)
        if weights is not None and weights_version is not None and weights_version > version:
            self.engine.load_weights(unpack_state_dict(weights), weights_version, "keep")

    async def submit(self, prompt_ids: list[int], params: SamplingParams, rid: str) -> TurnOutput:
        fut = self.engine.submit(prompt_ids, params, request_id=rid)
        return await asyncio.wrap_future(fut)

    async def submit_continue(
        self, rid: str, extra_ids: list[int], params: SamplingParams
    ) -> TurnOutput:
        fut = self.engine.submit_continue(rid, extra_ids, params)
        return await asyncio.wrap_future(fut)

    async def cancel(self, rid: str) -> bool:
        return _known(self.engine.cancel, rid)

    async def release(self, rid: str) -> bool:
        return _known(self.engine.release, rid)

    async def load_weights(
        self, weights: PackedWeights, version: int, mode: HotLoadMode
    ) -> tuple[HotLoadReport, float]:
        """The swap's report and the wall-clock time (``time.time()``) it ended: the pause
        was ``[end − update_ms, end]``, comparable across replicas."""
        sd = unpack_state_dict(weights)

        def swap() -> tuple[HotLoadReport, float]:
            rep = self.engine.load_weights(sd, version, mode)
            return rep, time.time()

        return await asyncio.get_running_loop().run_in_executor(None, swap)

    async def stats(self) -> dict[str, float]:
        return self.engine.stats()

    async def info(self) -> dict[str, Any]:
        """Where this replica runs: process id, Ray node id, version."""
        import ray

        return {
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "version": self.engine.version,
            "replica": self.replica,
        }

    async def wait_forever(self) -> None:
        await asyncio.Event().wait()

    async def close(self) -> None:
        self.engine.close()


def _known(op: Any, rid: str) -> bool:
    """``op(rid)``; False instead of the EngineError of an unknown request id."""
    try:
        op(rid)
    except EngineError:
        return False
    return True
