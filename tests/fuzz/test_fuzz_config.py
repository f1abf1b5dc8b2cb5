"""Fuzz: the config loader (YAML text, files, ``--set`` overrides)."""

from __future__ import annotations

import contextlib

from hypothesis import given, settings
from hypothesis import strategies as st

from provrl.config import ConfigError, load_config, parse_overrides, parse_yaml
from provrl.run_config import RunConfig

YAML_BITS = st.sampled_from(
    ["&a ", "*a", "&b ", "*b", "[", "]", "{", "}", ": ", ", ", "- ", "\n", "  ", "seed", "model",
     "name", "tiny", "1e-5", "!!python/object:os.system", "<<: *a", "'", '"', "#", "~", "null"]
)  # fmt: skip
YAML_TEXT = st.one_of(
    st.text(max_size=200), st.lists(YAML_BITS | st.text(max_size=5), max_size=60).map("".join)
)


@settings(max_examples=300, deadline=None)
@given(YAML_TEXT)
def test_parse_yaml_returns_or_raises_config_error(text):
    try:
        parse_yaml(text, "fuzz.yaml")
    except ConfigError as e:
        assert str(e).startswith("fuzz.yaml") and "\n" not in str(e).strip()
    except Exception as e:  # PyYAML's own parse errors are reported by load_yaml
        import yaml

        assert isinstance(e, yaml.YAMLError), repr(e)


@settings(max_examples=100, deadline=None)
@given(YAML_TEXT)
def test_load_config_from_any_file_is_a_config_or_a_config_error(tmp_path_factory, text):
    p = tmp_path_factory.mktemp("cfg") / "c.yaml"
    p.write_text(text)
    try:
        cfg = load_config(RunConfig, p)
    except ConfigError as e:
        assert "c.yaml" in str(e)
    else:
        assert isinstance(cfg, RunConfig)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=30), max_size=4))
def test_overrides_parse_or_raise_config_error(items):
    try:
        tree = parse_overrides(items)
    except ConfigError:
        return
    assert isinstance(tree, dict)
    with contextlib.suppress(ConfigError):
        assert isinstance(load_config(RunConfig, None, items), RunConfig)
