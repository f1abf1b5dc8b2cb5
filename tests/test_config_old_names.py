"""Old key names stay readable and say what they map to: ``pipeline.rl`` (now
``pipeline.loop``) and the top-level ``backend`` (now ``engine.backend``)."""

from __future__ import annotations

import pytest
import yaml

from provrl.config import ConfigError, load_config, old_name
from provrl.run_config import RunConfig


def test_pipeline_rl_is_read_as_pipeline_loop_from_every_source(tmp_path):
    cfg = load_config(RunConfig, "quick", ["pipeline.rl.steps=5", "pipeline.loop.k=3"])
    assert cfg.pipeline.loop.steps == 5 and cfg.pipeline.loop.k == 3
    old = tmp_path / "old.yaml"  # a config written before the rename
    old.write_text(yaml.safe_dump({"pipeline": {"rl": {"steps": 2}}, "backend": "local"}))
    assert load_config(RunConfig, old, ["pipeline.loop.steps=4"]).pipeline.loop.steps == 4
    assert RunConfig.model_validate({"pipeline": {"rl": {"k": 6}}}).pipeline.loop.k == 6
    assert old_name(RunConfig, "pipeline.loop.k") == "pipeline.rl.k"
    assert old_name(RunConfig, "pipeline.eval.k") is None


def test_an_old_key_in_an_error_is_named_as_given_and_says_what_it_is_now():
    with pytest.raises(ConfigError, match=r"'pipeline\.rl\.stepz' \(pipeline\.rl is the old name"):
        load_config(RunConfig, "quick", ["pipeline.rl.stepz=3"])
    with pytest.raises(ConfigError, match="give one of the two"):
        load_config(RunConfig, None, ["pipeline.rl.k=2", "pipeline.loop.k=3"])


def test_backend_is_the_old_name_of_engine_backend():
    cfg = load_config(RunConfig, "quick", ["backend=ray", "engine.backend=vllm"])
    assert cfg.engine.backend == "ray" and cfg.ray.engine == "vllm" and cfg.backend == "ray"
    assert load_config(RunConfig, "quick", ["engine.backend=ray"]).backend == "ray"
    local = load_config(RunConfig, "quick", ["engine.backend=vllm", "backend=local"])
    assert local.engine.backend == "vllm" and local.backend == "local"
    assert "backend" not in RunConfig().model_dump()  # written as engine.backend only
    with pytest.raises(ConfigError, match=r"old name of engine\.backend"):
        load_config(RunConfig, None, ["backend=spark"])


def test_removed_save_every_reads_as_1_and_refuses_any_other_value():
    """``pipeline.loop.save_every`` never did anything but 1 (every version is saved before
    it is hot-loaded); an old config that says 1 still loads, another value is one line."""
    assert load_config(RunConfig, "quick", ["pipeline.loop.save_every=1"]).pipeline.loop.k >= 1
    with pytest.raises(ConfigError, match="save_every was removed"):
        load_config(RunConfig, "quick", ["pipeline.loop.save_every=5"])
