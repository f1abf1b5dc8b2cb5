"""Benchmark of the trajectory log: write / read throughput (tokens/s) and bytes per token.

provrl's format (JSONL, per-token columns as base64 of little-endian bytes, zlib level 1,
CRC per line) is measured side by side with the alternatives it was chosen over, on the
same trajectories in the same run:

* ``jsonl-b64``       provrl, uncompressed columns
* ``jsonl-b64-zlib``  provrl default (``TrajectoryWriter(compress=True)``)
* ``jsonl-lists``     one JSON number list per column (orjson), the obvious JSONL
* ``arrow-ipc``       an Arrow IPC stream, one record batch per trajectory (if pyarrow)

Trajectories look like agent rollouts: a prompt, then turns of sampled actions (versions
advancing, as under hot-load) separated by tool observations; float32 logprobs are random
(incompressible), kept_mass is < 1 on a fraction of tokens.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from provrl.provenance import TOKEN_COLUMNS, Identity, SamplingParams, Trajectory, TrajectoryBuilder
from provrl.trajlog import TrajectoryWriter, read_trajectories, trajectory_to_record


def synthetic_trajectory(rng: np.random.Generator, n_tokens: int, traj_id: str) -> Trajectory:
    """An agent-like trajectory of exactly ``n_tokens`` tokens."""
    b = TrajectoryBuilder(
        traj_id,
        f"task-{rng.integers(10_000)}",
        sampling=SamplingParams(temperature=1.0, top_p=0.95, stop=("</search>", "</answer>")),
        policy=Identity("smollm2-135m", "sha256:" + "0" * 64, {"dtype": "float32"}),
        tools=Identity("sqlite-fts5-bm25", "sha256:" + "1" * 64, {"k": 5}),
    )
    prompt = min(300, n_tokens // 4)
    b.add_prompt(rng.integers(0, 49152, prompt))
    version = int(rng.integers(0, 50))
    left = n_tokens - prompt
    while left > 0:
        n_act = min(left, int(rng.integers(20, 120)))
        kept = np.where(rng.random(n_act) < 0.3, rng.random(n_act), 1.0)
        kept = np.clip(kept, 1e-3, 1.0)
        versions = version + (np.arange(n_act) >= n_act // 2) * int(rng.random() < 0.3)
        b.add_actions(
            rng.integers(0, 49152, n_act),
            logprob=-rng.exponential(1.0, n_act),
            kept_mass=kept,
            version=versions,
            kv_min=np.full(n_act, max(0, version - 1)),
            kv_max=versions,
            replica=int(rng.integers(0, 4)),
        )
        version = int(versions[-1])
        left -= n_act
        n_obs = min(left, int(rng.integers(50, 200)))
        b.add_observation(rng.integers(0, 49152, n_obs))
        left -= n_obs
        b.next_turn()
    return b.build(reward=float(rng.random() < 0.5), metrics={"num_tool_calls": 3.0})


# --------------------------------------------------------------------------- alternatives
def _lists_write(path: Path, trajs: Iterator[Trajectory]) -> None:
    with open(path, "wb") as f:
        for t in trajs:
            rec = trajectory_to_record(t, compress=False)
            rec["tokens"] = {name: getattr(t, name) for name in TOKEN_COLUMNS}
            f.write(orjson.dumps(rec, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
            f.flush()


def _lists_read(path: Path) -> Iterator[Trajectory]:
    with open(path, "rb") as f:
        for line in f:
            rec = orjson.loads(line)
            cols = {n: np.asarray(rec["tokens"][n], dtype=d) for n, d in TOKEN_COLUMNS.items()}
            yield Trajectory.from_columns(
                rec["traj_id"], rec["task_id"], cols, reward=rec["reward"]
            )


def _arrow_write(path: Path, trajs: Iterator[Trajectory]) -> None:
    import pyarrow as pa

    schema = pa.schema([(name, pa.from_numpy_dtype(d)) for name, d in TOKEN_COLUMNS.items()])
    schema = schema.with_metadata({"format": "provrl-bench"})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for t in trajs:
            batch = pa.record_batch([pa.array(getattr(t, n)) for n in TOKEN_COLUMNS], schema=schema)
            meta = orjson.dumps({"traj_id": t.traj_id, "task_id": t.task_id, "reward": t.reward})
            writer.write_batch(batch, custom_metadata={"meta": meta})
            sink.flush()


def _arrow_read(path: Path) -> Iterator[Trajectory]:
    import pyarrow as pa

    with pa.OSFile(str(path), "rb") as source:
        reader = pa.ipc.open_stream(source)
        while True:
            try:
                batch, custom = reader.read_next_batch_with_custom_metadata()
            except StopIteration:
                return
            meta = orjson.loads(custom[b"meta"])
            cols = {
                n: batch.column(i).to_numpy(zero_copy_only=False)
                for i, n in enumerate(TOKEN_COLUMNS)
            }
            yield Trajectory.from_columns(
                meta["traj_id"], meta["task_id"], cols, reward=meta["reward"]
            )


def _provrl_write(compress: bool) -> Callable[[Path, Iterator[Trajectory]], None]:
    def write(path: Path, trajs: Iterator[Trajectory]) -> None:
        with TrajectoryWriter(path, compress=compress, validate=False) as w:
            for t in trajs:
                w.write(t)

    return write


FORMATS: dict[str, tuple[Callable[..., None], Callable[[Path], Iterator[Trajectory]]]] = {
    "jsonl-b64": (_provrl_write(False), read_trajectories),
    "jsonl-b64-zlib": (_provrl_write(True), read_trajectories),
    "jsonl-lists": (_lists_write, _lists_read),
    "arrow-ipc": (_arrow_write, _arrow_read),
}


def run_log_benchmark(
    n_trajectories: int = 10_000,
    n_tokens: int = 2_000,
    *,
    formats: tuple[str, ...] | None = None,
    repeats: int = 1,
    distinct: int = 64,
    seed: int = 0,
) -> dict[str, Any]:
    """Write and read ``n_trajectories`` × ``n_tokens`` in each format; report tokens/s
    (median over ``repeats``), bytes per token and throughput ratios vs ``jsonl-lists``."""
    try:
        import pyarrow  # noqa: F401

        have_arrow = True
    except ImportError:
        have_arrow = False
    names = formats or tuple(n for n in FORMATS if have_arrow or n != "arrow-ipc")
    rng = np.random.default_rng(seed)
    pool = [synthetic_trajectory(rng, n_tokens, f"p{i}") for i in range(distinct)]

    def stream() -> Iterator[Trajectory]:
        for i in range(n_trajectories):
            t = pool[i % distinct]
            t.traj_id = f"traj-{i}"
            yield t

    total_tokens = n_trajectories * n_tokens
    results: dict[str, dict[str, float]] = {}
    raw: dict[str, dict[str, list[float]]] = {}  # seconds of every repeat
    with tempfile.TemporaryDirectory(prefix="provrl-logbench-") as tmp:
        for name in names:
            write, read = FORMATS[name]
            w_times, r_times = [], []
            size = 0
            for _ in range(repeats):
                path = Path(tmp) / f"{name}.log"
                t0 = time.perf_counter()
                write(path, stream())
                w_times.append(time.perf_counter() - t0)
                size = path.stat().st_size
                t0 = time.perf_counter()
                n_read = sum(1 for _ in read(path))
                r_times.append(time.perf_counter() - t0)
                assert n_read == n_trajectories, (name, n_read)
                os.remove(path)
            results[name] = {
                "write_tokens_per_s": total_tokens / statistics.median(w_times),
                "read_tokens_per_s": total_tokens / statistics.median(r_times),
                "bytes_per_token": size / total_tokens,
            }
            raw[name] = {"write_s_all": w_times, "read_s_all": r_times}
    base = results.get("jsonl-lists")
    if base:
        for r in results.values():
            r["write_ratio_vs_jsonl_lists"] = r["write_tokens_per_s"] / base["write_tokens_per_s"]
            r["read_ratio_vs_jsonl_lists"] = r["read_tokens_per_s"] / base["read_tokens_per_s"]
    chosen = results.get("jsonl-b64-zlib")
    return {
        "trajectories": n_trajectories,
        "tokens_per_trajectory": n_tokens,
        "repeats": repeats,
        "format": "jsonl-b64-zlib",
        "write_tokens_per_s": chosen["write_tokens_per_s"] if chosen else None,
        "read_tokens_per_s": chosen["read_tokens_per_s"] if chosen else None,
        "bytes_per_token": chosen["bytes_per_token"] if chosen else None,
        "formats": {k: {m: round(v, 3) for m, v in r.items()} | raw[k] for k, r in results.items()},
    }
