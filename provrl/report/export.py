"""``provrl trajectories export``: a trajectory log as a Parquet table (one row per
trajectory) that pandas, polars, DuckDB and ``datasets`` read directly.

Columns: ``traj_id``, ``task_id``, ``reward``, ``num_tokens``, ``num_actions``; the per-token
provenance as list columns with their log dtypes (``token_id``, ``is_action``, ``version``,
``logprob``, ``kept_mass``, ``kv_min``, ``kv_max``, ``replica``); ``segments`` as a list of
``{kind, start, end, turn}``; and the nested records (``tool_calls``, ``metrics``,
``timings``, ``sampling``, ``policy``, ``tools``, ``meta``) as JSON strings, since their keys
differ between trajectories. Nothing is re-tokenized or rounded: a token's ``logprob`` is
the float32 the log holds.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from provrl.provenance import TOKEN_COLUMNS
from provrl.trajlog import read_trajectories

JSON_COLUMNS = ("tool_calls", "metrics", "timings", "sampling", "policy", "tools", "meta")


def export_parquet(
    log: str | os.PathLike[str], out: str | os.PathLike[str], *, batch: int = 1024
) -> dict[str, Any]:
    """Write the trajectories of ``log`` to ``out`` (Parquet, zstd), streaming ``batch``
    trajectories per row group; atomically (temporary file, then rename). Returns counts."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    token_types = {
        name: pa.list_(pa.from_numpy_dtype(np.dtype(dt))) for name, dt in TOKEN_COLUMNS.items()
    }
    segment = pa.struct([("kind", pa.string()), ("start", pa.int32()), ("end", pa.int32()),
                         ("turn", pa.int32())])  # fmt: skip
    schema = pa.schema(
        [("traj_id", pa.string()), ("task_id", pa.string()), ("reward", pa.float64()),
         ("num_tokens", pa.int32()), ("num_actions", pa.int32())]
        + list(token_types.items())
        + [("segments", pa.list_(segment))]
        + [(name, pa.string()) for name in JSON_COLUMNS]
    )  # fmt: skip
    final = Path(out)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    rows: dict[str, list[Any]] = {f.name: [] for f in schema}
    n_traj = n_tok = 0

    def flush(writer: Any) -> None:
        if rows["traj_id"]:
            writer.write_table(pa.table(rows, schema=schema))
            for v in rows.values():
                v.clear()

    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            for t in read_trajectories(log):
                rows["traj_id"].append(t.traj_id)
                rows["task_id"].append(t.task_id)
                rows["reward"].append(t.reward)
                rows["num_tokens"].append(len(t))
                rows["num_actions"].append(t.num_actions)
                for name in TOKEN_COLUMNS:
                    rows[name].append(getattr(t, name))
                rows["segments"].append([asdict(s) for s in t.segments])
                rows["tool_calls"].append(json.dumps([asdict(c) for c in t.tool_calls]))
                rows["metrics"].append(json.dumps(t.metrics))
                rows["timings"].append(json.dumps(t.timings))
                rows["sampling"].append(json.dumps(t.sampling.to_dict()))
                rows["policy"].append(json.dumps(asdict(t.policy), default=str))
                rows["tools"].append(json.dumps(asdict(t.tools), default=str))
                rows["meta"].append(json.dumps(t.meta, default=str))
                n_traj += 1
                n_tok += len(t)
                if len(rows["traj_id"]) >= batch:
                    flush(writer)
            flush(writer)
        tmp.replace(final)
    finally:
        tmp.unlink(missing_ok=True)
    return {"out": str(final), "trajectories": n_traj, "tokens": n_tok}
