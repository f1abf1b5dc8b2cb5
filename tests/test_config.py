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


BOMB = "\n".join(
    [
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
        *(
            f"{y}: &{y} [{','.join([f'*{x}'] * 9)}]"
            for x, y in zip("abcdefgh", "bcdefghi", strict=True)
        ),
    ]
)


def test_yaml_alias_bomb_is_refused_fast_with_one_line(tmp_path):
    """A ~400-byte 'billion laughs' config used to take > 60 s and > 3 GB (validation and
    the error message walked the expanded tree)."""
    import time

    p = tmp_path / "bomb.yaml"
    p.write_text(BOMB + "\nseed: *i\n")
    assert len(p.read_bytes()) < 500
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"bomb\.yaml: line 6: YAML anchors/aliases expand") as e:
        load_config(RunConfig, p)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"override 'seed' \(command line\).*alias"):
        load_config(RunConfig, None, ["seed={" + BOMB.replace("\n", ", ") + ", z: *i}"])
    assert time.perf_counter() - t0 < 5  # generous: it is milliseconds; a regression is minutes


def test_small_anchors_still_work_and_recursive_ones_are_refused(tmp_path):
    p = tmp_path / "ok.yaml"
    p.write_text("seed: &s 5\n")
    assert load_config(RunConfig, p).seed == 5
    from provrl.config import parse_yaml

    assert parse_yaml("a: &x [1, 2]\nb: *x\n", "t") == {"a": [1, 2], "b": [1, 2]}
    with pytest.raises(ConfigError, match="t: line 1: YAML anchors"):
        parse_yaml("a: &x [*x]\n", "t")
    with pytest.raises(ConfigError, match="nested too deeply"):
        parse_yaml("[" * 100_000, "t")


def test_config_size_is_bounded_and_bad_values_are_quoted_short(tmp_path):
    from provrl.config import MAX_CONFIG_BYTES

    p = tmp_path / "big.yaml"
    p.write_text("seed: 1\n" + "#" * MAX_CONFIG_BYTES)
    with pytest.raises(ConfigError, match=r"big\.yaml: longer than \d+ bytes"):
        load_config(RunConfig, p)
    with pytest.raises(ConfigError, match="key 'seed'") as e:
        load_config(RunConfig, None, ["seed=[" + ", ".join(["1"] * 50_000) + "]"])
    assert len(str(e.value)) < 200
    (tmp_path / "bin.yaml").write_bytes(b"seed: \xff\n")
    with pytest.raises(ConfigError, match=r"bin\.yaml: not UTF-8"):
        load_config(RunConfig, tmp_path / "bin.yaml")


def test_device_a_machine_cannot_use_is_a_config_error_naming_the_key():
    """Issue 14: model.device=cuda on a CPU build died in an AssertionError inside torch."""
    import torch

    with pytest.raises(ConfigError, match=r"key 'model\.device': .*not a torch device"):
        load_config(RunConfig, None, ["model.device=banana"])
    with pytest.raises(ConfigError, match=r"key 'engine\.device': .*'cuda:99'"):
        load_config(RunConfig, None, ["engine.device=cuda:99"])
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            load_config(RunConfig, None, ["model.device=cuda"])
    assert load_config(RunConfig, None, ["model.device=cpu"]).model.device == "cpu"


def test_a_yaml_error_names_the_file_and_one_line(tmp_path):
    p = tmp_path / "my.yaml"
    p.write_text("model:\n  name: tiny\n bad: [\n")
    with pytest.raises(ConfigError) as e:
        load_config(RunConfig, p)
    msg = str(e.value)
    assert msg.startswith(f"{p}:3: invalid YAML at column 2: ") and "<unicode string>" not in msg
    assert msg.count("line") == 0, msg  # one line number: the one after the file name


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", ".inf", "1e999"])
def test_a_non_finite_number_is_refused_at_load_naming_the_field(value):
    with pytest.raises(ConfigError) as e:
        load_config(RunConfig, None, [f"rl.lr={value}"])
    msg = str(e.value)
    assert "\n" not in msg and "key 'rl.lr'" in msg and "finite" in msg


def test_a_non_finite_number_in_a_file_is_refused_naming_the_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("rl:\n  objective:\n    clip_eps_low: .nan\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: key 'rl\.objective\.clip_eps_low'.*finite"):
        load_config(RunConfig, p)
