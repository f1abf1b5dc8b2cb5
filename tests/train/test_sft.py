"""The SFT trainer on the tiny Llama (SmolLM2's real tokenizer) with real trajectories:
hand-built teacher traces and, end to end, the oracle's traces on a small built world."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from provrl.models import chat_ids, continuation_ids, load_model
from provrl.provenance import ProvenanceError, Trajectory, TrajectoryBatch, TrajectoryBuilder
from provrl.report.metrics import MetricsWriter, read_metrics
from provrl.train.config import SFTConfig
from provrl.train.sft import (
    accumulate_gradients,
    load_traces,
    lr_at,
    mean_nll,
    micro_logprobs,
    pack_micro_batches,
    plan_steps,
    save_sft_checkpoint,
    select_traces,
    sft_loss,
    train_sft,
)
from provrl.trajlog import CorruptLogError, TrajectoryWriter

QUESTIONS = [
    ("In which city was Orlan Vesk born?", "Orlan Vesk", "Dunmere"),
    ("Where is the Zapas Company headquartered?", "Zapas Company", "Vailrommere"),
    ("In what year was Dimmirkcrest founded?", "Dimmirkcrest", "1669"),
    ("Who founded the Kodrou Observatory?", "Kodrou Observatory", "Grelpirk Pandgrox"),
]


def teacher_trace(
    tok,
    question: str,
    query: str,
    answer: str,
    *,
    task_id: str,
    traj_id: str | None = None,
    reward: float = 1.0,
    tool_calls: float = 1.0,
    tail: str | None = None,
    tail_is_action: bool = False,
) -> Trajectory:
    """A two-turn teacher trace the way the agent loop assembles one: prompt, a search
    action, the observation (non-action), an answer action; optionally a trailing segment."""
    b = TrajectoryBuilder(traj_id or f"{task_id}-0", task_id)
    b.add_prompt(
        chat_ids(
            tok,
            [
                {"role": "system", "content": "Search."},
                {"role": "user", "content": f"Question: {question}"},
            ],
        )
    )

    def act(text: str) -> None:
        ids = tok.encode(text, add_special_tokens=False)
        n = len(ids)
        b.add_actions(
            ids, logprob=[0.0] * n, kept_mass=[1.0] * n, version=0, kv_min=0, kv_max=0, replica=0
        )

    act(f"<search>{query}</search>")
    b.next_turn()
    obs = f"<information>\n[1] {query} (d0000001): {query} is linked to {answer}.\n</information>"
    b.add_observation(continuation_ids(tok, "user", obs))
    act(f"<answer>{answer}</answer>")
    if tail is not None:
        if tail_is_action:
            act(tail)
        else:
            b.add_template(tok.encode(tail, add_special_tokens=False))
    return b.build(reward=reward, metrics={"num_tool_calls": tool_calls})


@pytest.fixture(scope="module")
def traces(tokenizer):
    return [
        teacher_trace(tokenizer, q, s, a, task_id=f"task{i}")
        for i, (q, s, a) in enumerate(QUESTIONS)
    ]


def fresh_tiny():
    return load_model("tiny", seed=0).model


# ----------------------------------------------------------------------------- the loss
def test_sft_loss_hand_computation():
    logp = torch.tensor([[0.0, -1.0, -2.0, -0.5], [0.0, -3.0, float("nan"), 0.0]])
    mask = torch.tensor([[False, True, False, True], [False, True, False, False]])
    # mean over the 3 action tokens of −log π: (1 + 0.5 + 3) / 3; the NaN is not an action
    assert float(sft_loss(logp, mask, 3)) == pytest.approx(1.5)
    # N is the step's action count: a micro-batch holding 3 of a step's 6 tokens gives half
    assert float(sft_loss(logp, mask, 6)) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="no action tokens"):
        sft_loss(logp, mask, 0)


def test_loss_is_mean_nll_of_action_tokens_from_full_logits(tiny, traces):
    """The trainer's loss equals a hand computation from the full [B, T, V] logits."""
    cfg = SFTConfig()
    tb = TrajectoryBatch.from_trajectories(traces, tiny.tokenizer.pad_token_id)
    with torch.no_grad():
        logp = micro_logprobs(tiny.model, tb, cfg, torch.device("cpu"))
        loss = sft_loss(logp, tb.action_mask, int(tb.action_mask.sum()))
        logits = tiny.model(input_ids=tb.input_ids, attention_mask=tb.attention_mask.long()).logits
        logsm = torch.log_softmax(logits.double(), -1)
    terms = [
        -float(logsm[b, t - 1, tb.input_ids[b, t]])
        for b in range(len(traces))
        for t in range(1, int(tb.lengths[b]))
        if traces[b].is_action[t]
    ]
    assert len(terms) == sum(t.num_actions for t in traces)
    assert float(loss) == pytest.approx(float(np.mean(terms)), rel=1e-5)
    assert float(loss) > 5  # a random 49k-vocab model: ≈ log V, not a degenerate 0
    assert mean_nll(tiny.model, traces, cfg, pad_token_id=tiny.tokenizer.pad_token_id) == (
        pytest.approx(float(loss), rel=1e-6)
    )


def _grads(model, trajs, micro, cfg, pad):
    model.zero_grad(set_to_none=True)
    loss, _ = accumulate_gradients(model, trajs, micro, cfg, pad_token_id=pad)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return loss, grads


def test_non_action_targets_do_not_change_loss_or_gradient(tiny, tokenizer):
    """Changing the trailing non-action tokens (their targets) leaves loss and gradient
    unchanged; the same tokens as actions do change them (the test can fail)."""
    q, s, a = QUESTIONS[0]
    pad, cfg = tokenizer.pad_token_id, SFTConfig()
    base = teacher_trace(tokenizer, q, s, a, task_id="t", tail="<|im_end|>\nThanks, bye.")
    other = teacher_trace(tokenizer, q, s, a, task_id="t", tail="<|im_end|>\nSomething else!")
    as_act = teacher_trace(
        tokenizer, q, s, a, task_id="t", tail="<|im_end|>\nSomething else!", tail_is_action=True
    )
    assert base.num_actions == other.num_actions < as_act.num_actions
    l0, g0 = _grads(tiny.model, [base], [[0]], cfg, pad)
    l1, g1 = _grads(tiny.model, [other], [[0]], cfg, pad)
    l2, g2 = _grads(tiny.model, [as_act], [[0]], cfg, pad)
    assert l1 == pytest.approx(l0, rel=1e-6, abs=0)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-5, atol=1e-7)
    assert abs(l2 - l0) > 1e-3
    assert any(not torch.allclose(g2[n], g0[n], rtol=1e-3, atol=1e-6) for n in g0)


def test_micro_batching_gives_the_same_gradient_as_one_batch(tiny, traces):
    pad, cfg = tiny.tokenizer.pad_token_id, SFTConfig()
    rows = list(range(len(traces)))
    lengths = [len(t) for t in traces]
    one = pack_micro_batches(lengths, rows, budget=10**6)
    many = pack_micro_batches(lengths, rows, budget=1)
    assert len(one) == 1 and len(many) == len(traces)
    l_one, g_one = _grads(tiny.model, traces, one, cfg, pad)
    l_many, g_many = _grads(tiny.model, traces, many, cfg, pad)
    assert l_many == pytest.approx(l_one, rel=1e-6)
    for n in g_one:
        torch.testing.assert_close(g_many[n], g_one[n], rtol=1e-4, atol=1e-7)
    # the gradient of a per-micro-batch mean (the classic accumulation bug) differs
    lens = [t.num_actions for t in traces]
    assert max(lens) != min(lens)


# ----------------------------------------------------------------------------- planning
def test_pack_micro_batches_respects_budget_and_covers_rows():
    lengths = [300, 120, 800, 50, 400, 120, 2000]
    groups = pack_micro_batches(lengths, range(len(lengths)), budget=1000)
    assert sorted(r for g in groups for r in g) == list(range(len(lengths)))
    for g in groups:
        assert len(g) == 1 or len(g) * max(lengths[r] for r in g) <= 1000
    assert [6] in groups  # longer than the budget: alone


def test_plan_steps_epochs_batches_and_seeded_shuffle():
    lengths = [10] * 10
    cfg = SFTConfig(epochs=2, batch_size=4, micro_batch_tokens=20, seed=3)
    steps = plan_steps(lengths, cfg)
    assert [e for e, _ in steps] == [0, 0, 0, 1, 1, 1]
    for epoch in (0, 1):
        rows = [r for e, micro in steps if e == epoch for g in micro for r in g]
        assert sorted(rows) == list(range(10))
    assert all(len(g) <= 2 for _, micro in steps for g in micro)
    assert plan_steps(lengths, cfg) == steps
    assert plan_steps(lengths, cfg.model_copy(update={"seed": 4})) != steps


def test_lr_schedule():
    cfg = SFTConfig(lr=1.0, warmup_steps=4, min_lr_ratio=0.1, schedule="cosine")
    S = 14
    assert [lr_at(s, S, cfg) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(4, S, cfg) == pytest.approx(1.0)
    assert lr_at(S - 1, S, cfg) == pytest.approx(0.1)
    mid = 4 + (S - 4 - 1) / 2
    assert lr_at(int(mid), S, cfg) > 0.55 > lr_at(int(mid) + 1, S, cfg)  # ½(1+r) between
    lin = cfg.model_copy(update={"schedule": "linear"})
    assert lr_at(S - 1, S, lin) == pytest.approx(0.1)
    assert lr_at(9, S, lin) == pytest.approx(1 - 0.9 * 5 / 9)
    const = cfg.model_copy(update={"schedule": "constant"})
    assert lr_at(S - 1, S, const) == 1.0


# ----------------------------------------------------------------------------- selection
def test_select_traces_strategies(tokenizer):
    q, s, a = QUESTIONS[0]

    def tr(task, i, reward, calls, tail=None):
        return teacher_trace(
            tokenizer,
            q,
            s,
            a,
            task_id=task,
            traj_id=f"{task}-{i}",
            reward=reward,
            tool_calls=calls,
            tail=tail,
        )

    pool = [
        tr("A", 0, 1.0, 3),
        tr("A", 1, 1.0, 1, tail="long tail"),
        tr("A", 2, 1.0, 1),
        tr("A", 3, 0.0, 1),
        tr("B", 0, 0.0, 2),
        tr("C", 0, 1.0, 2),
        tr("C", 1, 1.0, 4),
    ]
    ids = lambda ts: [t.traj_id for t in ts]  # noqa: E731
    assert len(select_traces(pool, SFTConfig(selection="all"))) == 7
    assert ids(select_traces(pool, SFTConfig(selection="successful"))) == [
        "A-2",
        "A-1",
        "A-0",
        "C-0",
        "C-1",
    ]
    assert ids(select_traces(pool, SFTConfig(selection="fewest_tool_calls"))) == [
        "A-2",
        "A-1",
        "C-0",
    ]
    assert ids(select_traces(pool, SFTConfig(selection="successful", max_per_task=1))) == [
        "A-2",
        "C-0",
    ]
    sub = select_traces(pool, SFTConfig(selection="all", max_traces=3, seed=1))
    assert len(sub) == 3 and sub == select_traces(
        pool, SFTConfig(selection="all", max_traces=3, seed=1)
    )


def test_select_shorthand_dedupe_and_origins(tokenizer):
    import dataclasses

    from provrl.provenance import Identity
    from provrl.train.sft import dedupe_traces, parse_select, trace_origin

    assert parse_select("all") == {"selection": "successful", "max_per_task": 0}
    assert parse_select("shortest") == {"selection": "fewest_tool_calls"}
    assert parse_select("per-task-max=3") == {"selection": "successful", "max_per_task": 3}
    for bad in ("best", "per-task-max=0", "per-task-max=x", "per-task-max="):
        with pytest.raises(ValueError, match="per-task-max=M"):
            parse_select(bad)
    q, s, a = QUESTIONS[0]
    t0 = teacher_trace(tokenizer, q, s, a, task_id="A", traj_id="A-0")
    same = dataclasses.replace(t0, traj_id="A-1")  # the same tokens, another sample
    other_task = dataclasses.replace(t0, traj_id="B-0", task_id="B")
    longer = teacher_trace(tokenizer, q, s, a, task_id="A", traj_id="A-2", tail="more")
    assert [t.traj_id for t in dedupe_traces([t0, same, other_task, longer])] == [
        "A-0",
        "B-0",
        "A-2",
    ]
    assert trace_origin(dataclasses.replace(t0, policy=Identity("oracle"))) == "teacher (oracle)"
    assert trace_origin(dataclasses.replace(t0, policy=Identity("chat-data"))) == "chat data"
    assert trace_origin(dataclasses.replace(t0, policy=Identity("runs/x/ckpt"))) == "policy"


def test_select_flag_rejects_a_bad_value(tmp_path):
    import typer

    from provrl.cli.sft import sft

    app = typer.Typer()
    app.command()(sft)
    res = CliRunner().invoke(
        app, ["--traces", str(tmp_path), "--out", str(tmp_path / "o"), "--select", "best"]
    )
    assert res.exit_code == 2 and "--select" in res.output


# ----------------------------------------------------------------------------- training
def test_loss_goes_down_and_metrics_are_logged(traces, tokenizer, tmp_path):
    model = fresh_tiny()
    cfg = SFTConfig(
        lr=1e-2, warmup_steps=2, epochs=12, batch_size=4, schedule="constant", progress=False
    )
    with MetricsWriter(tmp_path, tensorboard=False) as mw:
        res = train_sft(model, traces, cfg, pad_token_id=tokenizer.pad_token_id, metrics=mw)
    assert res.steps == 12 and res.skipped_steps == 0 and len(res.losses) == 12
    assert res.action_tokens == 12 * sum(t.num_actions for t in traces)
    assert res.first_loss > 9 and res.last_loss < 0.5 * res.first_loss
    assert model.training is False  # the mode it was in (load_model returns eval mode)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 13))
    for key in ("sft/loss", "sft/lr", "sft/grad_norm", "sft/tokens_per_s", "sft/epoch"):
        assert all(key in r for r in rows), key
    assert rows[0]["sft/lr"] == pytest.approx(5e-3) and rows[-1]["sft/lr"] == 1e-2
    assert [r["sft/loss"] for r in rows] == pytest.approx(res.losses)


def test_gradient_checkpointing_trains_the_same_weights(traces, tokenizer):
    """sft.gradient_checkpointing recomputes the decoder layers in backward: the same losses
    and weights, and the model is left as it was (not checkpointing)."""
    cfg = SFTConfig(lr=1e-2, warmup_steps=1, epochs=2, batch_size=4, progress=False)
    out = []
    for gc in (False, True):
        model = fresh_tiny()
        res = train_sft(model, traces, cfg.model_copy(update={"gradient_checkpointing": gc}),
                        pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        assert not model.is_gradient_checkpointing
        out.append((res.losses, model.state_dict()))
    (l0, w0), (l1, w1) = out
    assert l1 == pytest.approx(l0, rel=1e-6)
    for k in w0:
        torch.testing.assert_close(w1[k], w0[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_weights_cast_once_per_step_gives_the_same_bf16_run(traces, tokenizer, monkeypatch, checkpointing):  # fmt: skip
    """Under bf16 autocast SFT casts each weight once per optimizer step (one autocast
    context around the step's micro-batches: ``weights_cast_once``), not once per
    micro-batch. The cast is deterministic, so the run is the same one: identical losses and
    weights after four steps of several micro-batches (so the cast must not outlive a step),
    with and without recomputed layers."""
    import contextlib

    import provrl.train.sft as sft

    cfg = SFTConfig(lr=1e-2, warmup_steps=1, epochs=2, batch_size=2, micro_batch_tokens=1,
                    autocast="bfloat16", gradient_checkpointing=checkpointing, progress=False)  # fmt: skip
    out = []
    once_per_step = sft.weights_cast_once
    for once in (False, True):  # the reference first: nothing the other arm leaves behind
        # the reference: a fresh autocast context (and cast) per micro-batch
        monkeypatch.setattr(sft, "weights_cast_once", once_per_step if once else lambda cfg, device: contextlib.nullcontext())  # fmt: skip
        model = fresh_tiny()
        res = train_sft(model, traces, cfg, pad_token_id=tokenizer.pad_token_id)
        assert res.steps == 4
        assert torch.autocast_increment_nesting() == 1  # no autocast context left open
        torch.autocast_decrement_nesting()
        out.append((res.losses, model.state_dict()))
    (l0, w0), (l1, w1) = out
    assert l1 == l0
    for k in w0:
        torch.testing.assert_close(w1[k], w0[k], rtol=0, atol=0)


def test_checkpoint_round_trip_gives_identical_logits(traces, tokenizer, tmp_path):
    model = fresh_tiny()
    cfg = SFTConfig(lr=1e-3, epochs=2, batch_size=2, warmup_steps=0, progress=False)
    res = train_sft(model, traces, cfg, pad_token_id=tokenizer.pad_token_id)
    out = save_sft_checkpoint(model, tokenizer, tmp_path / "ckpt", res.summary())
    back = load_model(str(out))
    meta = json.loads((out / "provrl.json").read_text())
    assert meta["kind"] == "sft" and meta["steps"] == res.steps
    tb = TrajectoryBatch.from_trajectories(traces, tokenizer.pad_token_id)
    with torch.no_grad():
        a = model(input_ids=tb.input_ids, attention_mask=tb.attention_mask.long()).logits
        b = back.model(input_ids=tb.input_ids, attention_mask=tb.attention_mask.long()).logits
        c = fresh_tiny()(input_ids=tb.input_ids, attention_mask=tb.attention_mask.long()).logits
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)  # the checkpoint holds the trained weights
    assert back.tokenizer.encode("<search>x</search>") == tokenizer.encode("<search>x</search>")


# ----------------------------------------------------------------------------- bad input
def test_bad_trace_sets_give_clear_errors(traces, tokenizer, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.jsonl: no trajectories"):
        load_traces([empty])
    with pytest.raises(FileNotFoundError, match=r"missing\.jsonl: no such trajectory log"):
        load_traces([tmp_path / "missing.jsonl"])
    bad = tmp_path / "bad.jsonl"
    with TrajectoryWriter(bad) as w:
        w.write(traces[0])
    with open(bad, "ab") as f:
        f.write(b"this is not a record\n")
    with TrajectoryWriter(bad) as w:
        w.write(traces[1])
    with pytest.raises(CorruptLogError, match=r"bad\.jsonl:2"):
        load_traces([bad])
    with pytest.raises(ValueError, match="no trajectory files"):
        load_traces([])
    with pytest.raises(ValueError, match="empty"):
        select_traces([], SFTConfig())
    failed = [teacher_trace(tokenizer, *QUESTIONS[0], task_id="x", reward=0.0)]
    with pytest.raises(ValueError, match="none of the 1 traces is successful"):
        select_traces(failed, SFTConfig())
    # a trace without action tokens: the error names the file, line and trajectory
    b = TrajectoryBuilder("no-actions", "x")
    b.add_prompt(tokenizer.encode("hello there"))
    no_act = tmp_path / "noact.jsonl"
    with TrajectoryWriter(no_act) as w:
        w.write(traces[0])
        w.write(b.build(reward=1.0))
    with pytest.raises(
        ProvenanceError, match=r"noact\.jsonl:2: trajectory 'no-actions'.*no action"
    ):
        load_traces([no_act])
    model = fresh_tiny()
    with pytest.raises(ValueError, match="no trajectories"):
        train_sft(model, [], SFTConfig(), pad_token_id=0)
    big = teacher_trace(tokenizer, *QUESTIONS[0], task_id="big")
    big.token_id = big.token_id.copy()
    big.token_id[-1] = 60_000
    with pytest.raises(ProvenanceError, match=r"'big-0'.*≥ vocab 49152"):
        train_sft(model, [big], SFTConfig(progress=False), pad_token_id=0)


# ----------------------------------------------------------------------------- end to end
def test_oracle_traces_to_cli_checkpoint_to_eval(tmp_path):
    """oracle traces of a small built world → `provrl sft` on the tiny model → the
    checkpoint lowers the held-out NLL and `evaluate(policy=<dir>)` runs on it."""
    import typer

    from provrl.cli.sft import sft
    from provrl.env.build import build_world
    from provrl.env.config import EnvConfig, WorldConfig
    from provrl.rollout.evaluate import evaluate

    cfg = EnvConfig(world=WorldConfig(seed=7, entities=300, docs=800, tasks=120))
    world = tmp_path / "world"
    build_world(cfg.world, world)
    cfg.eval.split, cfg.eval.n = "train", 24
    evaluate("oracle", world, cfg, tmp_path / "oracle", progress=False)
    app = typer.Typer()
    app.command()(sft)
    ckpt = tmp_path / "ckpt"
    res = CliRunner().invoke(
        app,
        [
            "--traces",
            str(tmp_path / "oracle"),
            "--out",
            str(ckpt),
            "--model",
            "tiny",
            "--lr",
            "1e-2",
            "--epochs",
            "4",
            "--batch-size",
            "8",
            "--warmup-steps",
            "1",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["traces_selected"] == 24 and summary["steps"] == 12
    assert summary["origins_selected"] == {"teacher (oracle)": 24}
    assert summary["duplicates_removed"] == 0
    assert summary["last_loss"] < summary["first_loss"]
    assert (tmp_path / "ckpt-run" / "sft.json").is_file()
    traces = load_traces([tmp_path / "oracle"])
    assert all(t.policy.name == "oracle" for t in traces)
    pad = 2
    trained = load_model(str(ckpt))
    c = SFTConfig()
    assert mean_nll(trained.model, traces, c, pad_token_id=pad) < 0.6 * mean_nll(
        fresh_tiny(), traces, c, pad_token_id=pad
    )
    cfg.eval.split, cfg.eval.n, cfg.eval.k, cfg.eval.concurrency = "dev", 2, 1, 2
    cfg.agent.max_turns, cfg.agent.max_new_tokens = 2, 16
    summary = evaluate(str(ckpt), world, cfg, tmp_path / "eval", progress=False)
    assert summary["samples"] == 2 and summary["policy"] == str(ckpt)
    assert math.isfinite(summary["accuracy"])


def test_bad_cli_option_is_a_clear_error(tmp_path):
    import typer

    from provrl.cli.sft import sft

    app = typer.Typer()
    app.command()(sft)
    res = CliRunner().invoke(
        app, ["--traces", str(tmp_path), "--out", str(tmp_path / "o"), "--selection", "best"]
    )
    assert res.exit_code != 0
    assert "selection" in res.output
