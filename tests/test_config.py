"""Typed configs: YAML presets, dotted overrides, errors that name the key and the source."""

from __future__ import annotations

import pytest

from provrl.config import ConfigError, load_config, parse_overrides
from provrl.run_config import RunConfig


def test_overrides_parse_yaml_values():
    assert parse_overrides(["a.b=1e-5", "a.c=true", "d=[1, 2]", "e=hello"]) == {
        "a": {"b": 1e-5, "c": True},
        "d": [1, 2],
        "e": "hello",
    }


def test_preset_and_override(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("model:\n  name: tiny\nseed: 3\n")
    cfg = load_config(RunConfig, p, ["seed=7", "logging.tensorboard=false"])
    assert cfg.model.name == "tiny" and cfg.seed == 7 and cfg.logging.tensorboard is False


def test_unknown_key_in_file_names_key_and_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model:\n  nmae: tiny\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: unknown key 'model\.nmae'"):
        load_config(RunConfig, p)


def test_unknown_key_on_command_line():
    with pytest.raises(ConfigError, match=r"command line: unknown key 'model\.foo'"):
        load_config(RunConfig, None, ["model.foo=1"])


def test_bad_value_names_key():
    with pytest.raises(ConfigError, match=r"key 'seed'"):
        load_config(RunConfig, None, ["seed=abc"])


def test_malformed_override_and_missing_preset(tmp_path):
    with pytest.raises(ConfigError, match=r"expected key\.sub=value"):
        load_config(RunConfig, None, ["seed"])
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(RunConfig, tmp_path / "nope.yaml")


def test_every_field_is_documented():
    from pydantic import BaseModel

    def walk(cls):
        for name, f in cls.model_fields.items():
            assert f.description, f"{cls.__name__}.{name} has no description"
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann)

    walk(RunConfig)
