"""`provrl run --set rl.lora.enabled=true`: the quick preset trains LoRA adapters, hot-loads
the merged weights into the engines, and leaves a checkpoint eval loads as a plain model."""

from __future__ import annotations

import json

from provrl.cli.entry import main

FAST = [
    "pipeline.loop.steps=2",
    "pipeline.eval.policies=[rl]",
    "pipeline.tasks.eval=2",
    "pipeline.eval.k=1",
    "rl.lora.enabled=true",
    "rl.lora.r=4",
]


def test_a_quick_lora_run_trains_hot_loads_and_evaluates(tmp_path):
    run = tmp_path / "run"
    args = ["run", "--preset", "quick", "--no-progress", "--set", f"logging.run_dir={run}"]
    assert main([*args, *(x for kv in FAST for x in ("--set", kv))]) == 0
    assert json.loads((run / "rl" / "done.json").read_text())["steps"] == 2
    assert json.loads((run / "eval" / "done.json").read_text())["rl"]["n"] == 2
    ckpts = sorted((run / "rl").glob("ckpt-v*"))
    assert ckpts
    from provrl.models import load_model

    sd = load_model(str(ckpts[-1])).model.state_dict()
    assert not any("lora" in k or "base_layer" in k for k in sd)
