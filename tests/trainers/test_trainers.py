"""TRL's front doors: GRPOConfig's names land on provrl's keys through the peer table, what
provrl lacks is one line, and GRPOTrainer turns datasets, tools and reward callables into the
run config ``provrl run`` runs (the run itself: tests/test_examples.py, README's example)."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from provrl.config import ConfigError, peer_tables
from provrl.run_config import RunConfig
from provrl.trainers.grpo import OWN_FIELDS, GRPOConfig, GRPOTrainer


def test_every_trl_field_is_a_peer_name_or_mapped_here():
    trl, _ = peer_tables(RunConfig)
    top = set(RunConfig.model_fields)
    unmapped = [f.name for f in fields(GRPOConfig) if f.name not in {*trl, *top, *OWN_FIELDS}]
    assert not unmapped, unmapped


def test_trl_names_set_provrl_keys():
    cfg = GRPOConfig(
        output_dir="o", max_steps=5, num_generations=4, learning_rate=3e-6, beta=0.02,
        epsilon=0.1, epsilon_high=0.3, max_staleness=2, temperature=0.7, seed=9,
        reward_weights=[1.0, 0.5], preset="quick", overrides=["env.agent.rewards=[em, f1]"],
    ).run_config()  # fmt: skip
    assert (cfg.logging.run_dir, cfg.pipeline.loop.steps, cfg.pipeline.loop.k) == ("o", 5, 4)
    assert (cfg.rl.lr, cfg.rl.objective.kl_coef) == (3e-6, 0.02)
    assert (cfg.rl.objective.clip_eps_low, cfg.rl.objective.clip_eps_high) == (0.1, 0.3)
    assert (cfg.pipeline.loop.max_lag, cfg.env.agent.temperature, cfg.seed) == (2, 0.7, 9)
    assert cfg.env.agent.reward_weights == (1.0, 0.5)


def test_batch_size_becomes_whole_groups_and_bf16_mixed_precision():
    cfg = GRPOConfig(
        preset="quick", num_generations=4, per_device_train_batch_size=8,
        gradient_accumulation_steps=2, bf16=True,
    ).run_config()  # fmt: skip
    assert (cfg.pipeline.loop.groups_per_step, cfg.rl.micro_batch_size) == (4, 8)
    assert (cfg.rl.autocast, cfg.engine.dtype) == ("bfloat16", "bfloat16")
    with pytest.raises(ConfigError, match="not a multiple of num_generations=4"):
        GRPOConfig(preset="quick", num_generations=4, per_device_train_batch_size=6).run_config()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_completion_length": 256}, "'max_completion_length' has no provrl field: .*env.agent.max_new_tokens bounds one turn"),
        ({"num_train_epochs": 3}, "'num_train_epochs' has no provrl field: the RL stage runs max_steps"),
        ({"logging_steps": 10}, "'logging_steps' has no provrl field: every RL step is logged"),
        ({"learning_rat": 1e-5}, "unknown field 'learning_rat' \\(did you mean 'learning_rate'\\?"),
    ],
)  # fmt: skip
def test_what_provrl_lacks_is_one_line(kwargs, match):
    with pytest.raises(ConfigError, match=match) as e:
        GRPOConfig(**kwargs)
    assert "\n" not in str(e.value)


def test_the_trainer_builds_the_run_config(tmp_path):
    from provrl.env.rewards import reward_function

    def correct(completions, answer, **kwargs):
        return [float(a in c[-1]["content"]) for c, a in zip(completions, answer, strict=True)]

    def format(completions, **kwargs):  # a user's function named like a built-in
        return [0.0 for _ in completions]

    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"id": "d1", "title": "Halvex", "text": "It is in Dunmere."}) + "\n")
    rows = [{"prompt": [{"role": "user", "content": "Where is Halvex?"}], "answer": "Dunmere",
             "level": 2}]  # fmt: skip
    args = GRPOConfig(output_dir=str(tmp_path / "run"), preset="quick", max_steps=1)
    t = GRPOTrainer("tiny", [correct, format, "f1"], args=args, train_dataset=rows, tools=docs)
    cfg = t.config
    assert cfg.env.agent.rewards == ("correct", "format_1", "f1")
    assert reward_function("format_1", lambda e: 0.0) is not None
    assert (cfg.model.name, cfg.pipeline.warmstart, cfg.pipeline.eval.policies) == (
        "tiny",
        False,
        (),
    )
    assert cfg.env.search.index == str(tmp_path / "run" / "data" / "docs.sqlite")
    task = json.loads((tmp_path / "run" / "data" / "train.jsonl").read_text())
    assert task["question"] == "Where is Halvex?" and task["level"] == 2
    assert cfg.pipeline.tasks.file == str(tmp_path / "run" / "data" / "train.jsonl")
    assert cfg.pipeline.eval.file is None  # no eval_dataset: no eval stage
    held_out = [{"question": "Who founded Halvex?", "answer": "Vesk"}]
    t = GRPOTrainer("tiny", "em", args=args, train_dataset=rows, eval_dataset=held_out)
    assert t.config.pipeline.eval.policies == ("base", "rl")
    assert t.config.pipeline.eval.file == str(tmp_path / "run" / "data" / "eval.jsonl")
    url = GRPOTrainer("tiny", "em", args=args, train_dataset=rows, tools="http://h:1/retrieve")
    assert (url.config.env.search.backend, url.config.env.search.url) == (
        "http",
        "http://h:1/retrieve",
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"reward_funcs": "org/reward-model"}, "provrl takes no reward models"),
        ({"reward_funcs": "em", "eval_dataset": [{"question": "q"}]}, "eval_dataset: .*field 'answer' is missing"),
        ({"reward_funcs": "em", "train_dataset": [{"question": "q"}]}, "field 'answer' is missing"),
        ({"reward_funcs": "em", "tools": "/no/such/docs.jsonl"}, "tools: /no/such/docs.jsonl: no such file"),
    ],
)  # fmt: skip
def test_trainer_inputs_that_cannot_run_are_one_line(tmp_path, kwargs, match):
    kw = {"train_dataset": [{"question": "q", "answer": "a"}], **kwargs}
    args = GRPOConfig(output_dir=str(tmp_path / "run"), preset="quick")
    with pytest.raises(ConfigError, match=match) as e:
        GRPOTrainer("tiny", args=args, **kw)
    assert "\n" not in str(e.value)


def test_a_parquet_dataset(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "qa.parquet"
    pq.write_table(pa.table({"question": ["Where?"], "answer": ["Here"], "n": [3]}), path)
    args = GRPOConfig(output_dir=str(tmp_path / "run"), preset="quick")
    t = GRPOTrainer("tiny", "em", args=args, train_dataset=str(path))
    row = json.loads(Path(t.config.pipeline.tasks.file).read_text())
    assert row == {"question": "Where?", "answer": "Here", "n": 3}


def test_sft_config_takes_trl_names_and_refuses_unknown_ones_in_one_line():
    from provrl import SFTConfig
    from provrl.train.config import SFTConfig as Section

    c = SFTConfig(output_dir="o", learning_rate=1e-3, num_train_epochs=2)
    assert isinstance(c, Section) and (c.lr, c.epochs, c.output_dir) == (1e-3, 2, "o")
    with pytest.raises(ConfigError, match="unknown key 'bogus'") as e:
        SFTConfig(bogus=1)
    assert "\n" not in str(e.value)


def test_sft_trainer_trains_on_chat_rows(tmp_path):
    from provrl import SFTConfig, SFTTrainer

    rows = [{"prompt": "Where is Halvex?", "completion": "<answer>Dunmere</answer>"}] * 4
    args = SFTConfig(output_dir=str(tmp_path / "sft"), batch_size=2, warmup_steps=0, progress=False)
    summary = SFTTrainer("tiny", args=args, train_dataset=rows).train()
    assert (tmp_path / "sft" / "ckpt" / "config.json").is_file() and summary["steps"] == 2
