"""An async quick run in which a hot-load lands mid-episode: the RL loop trains a
mixed-version trajectory, each of its tokens carrying the version and the log q it was
actually sampled with.

The swap is forced, not hoped for (on the tiny model a training step outlasts the turns in
flight, so a hot-load almost never finds one). The run's engine is wrapped: while the
learner trains a step, the engine's next sampled token is held (its ``on_token`` waits)
until the loop hot-loads that step's weights — so the turns generating then have sampled
under version v and continue under v + 1, as a trainer slower than its engine would cause.
The loop, collector, engine and trainer are the real ones.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from provrl.config import load_config
from provrl.env.build import load_split
from provrl.models import load_model
from provrl.pipeline.engines import engine_factory
from provrl.pipeline.rl_loop import RLLoop
from provrl.pipeline.rundir import RunDir
from provrl.pipeline.steplog import read_steps
from provrl.run_config import RunConfig
from provrl.trajlog import read_all


class HoldUntilSwap:
    """An engine whose tokens wait, while ``training`` is set, for the next hot-load."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.training = threading.Event()
        self.swapped = threading.Event()
        self.held = 0

    def _hold(self, on_token: Any) -> Any:
        def hook(rid: str, tok: int) -> None:
            if self.training.is_set() and not self.swapped.is_set():
                self.held += 1
                self.swapped.wait(120)  # the scheduler thread: this token's step is v
            if on_token is not None:
                on_token(rid, tok)

        return hook

    def submit(self, prompt_ids: Any, params: Any, **kw: Any) -> Any:
        return self._engine.submit(prompt_ids, params, **kw | {"on_token": self._hold(kw.get("on_token"))})  # fmt: skip

    def submit_continue(self, rid: str, extra: Any, params: Any, on_token: Any = None) -> Any:
        return self._engine.submit_continue(rid, extra, params, on_token=self._hold(on_token))

    def load_weights(self, weights: Any, version: int, mode: str = "keep") -> Any:
        self.training.clear()
        self.swapped.set()  # release the held token; the swap lands before the next step
        return self._engine.load_weights(weights, version, mode)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def test_an_async_run_trains_a_mixed_version_trajectory_with_its_recorded_q(tmp_path, small_world):
    sets = ["pipeline.loop.mode=async", "pipeline.loop.steps=2", f"logging.run_dir={tmp_path}",
            "pipeline.loop.hotload=keep"]  # fmt: skip
    cfg = load_config(RunConfig, "quick", sets)
    tasks = [t for t in load_split(small_world, "train") if t.tier in (1, 2)][:6]
    made: list[HoldUntilSwap] = []
    default = engine_factory(cfg)

    def engines(lm: Any, engine_cfg: Any, *, version: int = 0) -> Any:
        made.append(HoldUntilSwap(default(lm, engine_cfg, version=version)))
        return made[-1]

    loop = RLLoop.open(cfg, RunDir(tmp_path), small_world, tasks, "tiny", progress=False,
                       engines=engines)  # fmt: skip
    train = loop.train

    def training(groups: Any) -> Any:  # the learner thread: hold tokens until the swap
        made[0].swapped.clear()
        made[0].training.set()
        return train(groups)

    loop.train = training  # type: ignore[method-assign]
    with loop:
        loop.run_async()
    loop.finish()
    assert made[0].held >= 1, "no token was sampled while a step trained"

    steps = read_steps(tmp_path)
    trained = {tid: s for s in steps for tid in s["trained"]}
    mixed = [
        t
        for t in read_all(tmp_path / "rl" / "trajectories.jsonl")
        if len(np.unique(t.version[t.is_action])) > 1 and t.traj_id in trained
    ]
    assert mixed, "no trained trajectory holds two versions"
    assert sum(s["mixed_version_trajectories"] for s in steps) >= len(mixed)
    t = mixed[0]
    v = t.version[t.is_action]
    assert v[0] == 0 and v[-1] == 1 and (np.diff(v) >= 0).all()  # the swap came mid-episode
    assert t.kv_min[t.is_action].max() == 0  # keep: the v1 tokens attended to v0's KV
    assert len(trained[t.traj_id]["lag_histogram"]) >= 2  # its step saw both versions' lags
    assert trained[t.traj_id]["kv_stale_share"] > 0  # and its record counts the stale-KV tokens
    # its log q is the one each token was sampled with: the v0 tokens are version 0's
    # probabilities (the tiny start policy), recomputed here by teacher forcing
    lm = load_model("tiny")
    ids = torch.from_numpy(t.token_id.astype(np.int64))[None]
    with torch.no_grad():
        logits = lm.model(input_ids=ids).logits[0, :-1].double() / t.sampling.temperature
    lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0].numpy()
    act = np.flatnonzero(t.is_action)
    old = act[t.version[act] == 0]
    np.testing.assert_allclose(t.logprob[old], lp[old - 1], atol=1e-4)
