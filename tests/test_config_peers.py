"""TRL's flat names and verl's full paths resolve to provrl's fields, in a preset or on the
command line, and override a preset that used the field's own name; names without a
provrl field are refused naming what to use instead; near misses get "did you mean"."""

from __future__ import annotations

import typing

import pytest

from provrl.config import ConfigError, load_config, peer_tables
from provrl.run_config import RunConfig


def _get(cfg: RunConfig, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _field(dotted: str):
    cls, *parts, name = [RunConfig, *dotted.split(".")]
    for part in parts:
        cls = cls.model_fields[part].annotation
    return cls.model_fields[name]


def _candidates(dotted: str) -> list[str]:
    f = _field(dotted)
    d = f.default
    literal = [a for a in typing.get_args(f.annotation) if isinstance(a, str) and a != d]
    if isinstance(d, bool):
        return [str(not d).lower()]
    if isinstance(d, int):
        return [str(d + 1), str(2 * d + 1)]
    if isinstance(d, float):
        return [str(d / 2 if d else 0.5), "0.37", "1.5", "3.0"]
    if isinstance(d, str):
        return [*literal, "somewhere/else"]
    return ["0.3", "1.5", "3.0", "2", "[tensorboard]", "[0.5]"]


NEEDS = {
    "rl.lr_schedule": ["rl.lr_decay_steps=10"],
    "env.agent.reward_weights": ["env.agent.rewards=[em]"],
}
"""What a field's test value needs besides (a decaying schedule needs decay steps, a weight
its reward function)."""


def _value(dotted: str) -> tuple[str, object]:
    """A value (as --set text) that the field accepts and that differs from its default."""
    for text in _candidates(dotted):
        try:
            got = _get(
                load_config(RunConfig, None, [f"{dotted}={text}", *NEEDS.get(dotted, [])]), dotted
            )
        except ConfigError:
            continue
        if got != _field(dotted).default:
            return text, got
    raise AssertionError(f"no test value for {dotted}")


TRL, VERL = peer_tables(RunConfig)


@pytest.mark.parametrize(("name", "dotted"), sorted({**TRL, **VERL}.items()))
def test_every_trl_and_verl_name_sets_the_field_it_names(name, dotted):
    text, want = _value(dotted)
    needs = NEEDS.get(dotted, [])
    assert _get(load_config(RunConfig, "quick", [f"{name}={text}", *needs]), dotted) == want
    section = dotted.rpartition(".")[0]
    alias = name.rsplit(".", 1)[-1]  # the peer's own name, read inside the section too
    got = load_config(RunConfig, "quick", [f"{section}.{alias}={text}", *needs])
    assert _get(got, dotted) == want


def test_a_peer_name_overrides_a_preset_that_used_the_fields_own_name(tmp_path):
    assert load_config(RunConfig, "quick").rl.lr == 1e-4  # the preset says rl.lr
    for key in ("learning_rate", "rl.learning_rate", "actor_rollout_ref.actor.optim.lr"):
        assert load_config(RunConfig, "quick", [f"{key}=1e-5"]).rl.lr == 1e-5
    preset = tmp_path / "verl.yaml"
    preset.write_text("actor_rollout_ref:\n  actor:\n    optim: {lr: 2.0e-6}\n  rollout: {n: 6}\n")
    cfg = load_config(RunConfig, preset, ["rl.lr=3e-6"])
    assert cfg.rl.lr == 3e-6 and cfg.pipeline.loop.k == 6
    cfg = load_config(RunConfig, None, ["max_steps=5", "output_dir=o", "max_staleness=2"])
    assert (cfg.pipeline.loop.steps, cfg.logging.run_dir, cfg.pipeline.loop.max_lag) == (5, "o", 2)
    assert load_config(RunConfig, None, ["sft.learning_rate=1e-3"]).sft.lr == 1e-3


@pytest.mark.parametrize(
    ("sets", "match"),
    [
        (["learning_rate=1e-5", "rl.lr=1e-4"], "'learning_rate' sets 'rl.lr', which is given twice"),
        (["rl.lr=1", "rl.learning_rate=2"], r"'rl.learning_rate' \(it sets 'rl.lr', which is given twice\)"),
        (["actor_rollout_ref.actor.optim.lrr=1"],
         r"unknown verl key 'actor_rollout_ref.actor.optim.lrr' \(did you mean 'actor_rollout_ref.actor.optim.lr'\?\)"),
        (["learnin_rate=1"], r"unknown key 'learnin_rate' \(did you mean 'learning_rate', TRL's name of 'rl.lr'\?\)"),
        (["bf16=true"], "'bf16' has no provrl field: set model.dtype=bfloat16"),
        (["max_completion_length=64"], "env.agent.max_new_tokens bounds one turn"),
        (["trainer.test_freq=5"], "'trainer.test_freq' has no provrl field: no held-out eval"),
    ],
)  # fmt: skip
def test_wrong_or_missing_peer_names_are_one_line(sets, match):
    with pytest.raises(ConfigError, match=match) as e:
        load_config(RunConfig, "quick", sets)
    assert "\n" not in str(e.value)


def test_the_trl_and_verl_name_tables_round_trip():
    """Field → the peer name it declares → the table → the same field, for every field that
    declares one, and back: the tables hold only declared names, and no two fields claim
    one name (the table would keep the first, silently). A TRL name under a section of
    ``peers_not_flat`` (``sft``, whose names TRL's SFTConfig shares with GRPOConfig) is read
    inside its section only."""
    from provrl.config import _fields

    not_flat = tuple(f"{s}." for s in RunConfig.peers_not_flat)
    declared: dict[str, dict[str, list[str]]] = {"trl": {}, "verl": {}}
    for key, f in _fields(RunConfig):
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        for peer in declared:
            if isinstance(extra.get(peer), str) and not (peer == "trl" and key.startswith(not_flat)):  # fmt: skip
                declared[peer].setdefault(str(extra[peer]), []).append(key)
    for peer, table in (("trl", TRL), ("verl", VERL)):
        claimed = {name: keys for name, keys in declared[peer].items() if len(keys) > 1}
        assert not claimed, f"{peer} names claimed by two fields: {claimed}"
        assert table == {name: keys[0] for name, keys in declared[peer].items()}
    for key, f in _fields(RunConfig):  # the not-flat sections' names, inside the section
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        if key.startswith(not_flat) and isinstance(extra.get("trl"), str):
            text, want = _value(key)
            section = key.rpartition(".")[0]
            cfg = load_config(RunConfig, None, [f"{section}.{extra['trl']}={text}"])
            assert _get(cfg, key) == want, key
