"""`provrl bench trainer` tested on its code, on the tiny model and a slice of the shipped
fixture (no results file is read): each reference arm computes provrl's GRPO loss and
gradients on the same batch, and each side's memory breakdown explains its peak here."""

from __future__ import annotations

import json

import pytest

from provrl.bench.trainer import (
    FIXTURE,
    REFERENCES,
    ReferenceStep,
    SideSpec,
    _rl_config,
    batch_shape,
    load_batch,
    make_fixture,
    prefix_sharing_factor,
    run_sharing_factors,
    run_side,
)
from provrl.trajlog import TrajectoryWriter

PARTS = ("runtime_mib", "weights_mib", "grads_mib", "optimizer_mib", "activations_mib",
         "logits_mib", "published_mib")  # fmt: skip


@pytest.fixture(scope="module")
def small_fixture(tmp_path_factory):
    """Two groups × three trajectories of the shipped SmolLM2 batch."""
    trajs = load_batch()
    groups: dict[str, list] = {}
    for t in trajs:
        groups.setdefault(str(t.meta.get("group", t.task_id)), []).append(t)
    chosen = [t for g in list(groups.values())[:2] for t in g[:3]]
    path = tmp_path_factory.mktemp("bench") / "batch.jsonl"
    with TrajectoryWriter(path) as w:
        w.write_many(chosen)
    return path


def test_the_shipped_fixture_is_four_groups_of_eight():
    shape = batch_shape(load_batch())
    assert shape["trajectories"] == 32 and shape["groups"] == 4
    assert 300 <= shape["length_median"] <= 700 and shape["action_tokens"] > 0
    assert FIXTURE.stat().st_size < 1_000_000


@pytest.mark.parametrize("side", ["provrl", *REFERENCES])
def test_a_side_runs_one_step_and_its_memory_breakdown_adds_up(small_fixture, side):
    # a fresh process, as the benchmark runs each side: in pytest's long-lived one the
    # allocator reuses pages earlier tests freed, so the RSS peak under-counts the parts
    import multiprocessing

    spec = SideSpec(side, "tiny", str(small_fixture), 1, {}, count_flops=True)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        out = pool.apply(run_side, (spec,))
    assert out["step_s"] > 0 and out["matmul_flops"] > 0
    mem = out["memory"]
    assert set(PARTS) <= set(mem)
    # the parts held at the peak (the published copy comes after the backward's activations)
    transient = max(mem["activations_mib"] + mem["logits_mib"], mem["published_mib"])
    held = sum(mem[k] for k in PARTS[:4]) + transient
    assert held == pytest.approx(mem["held_at_peak_mib"], abs=0.5)
    # issue 22's bound, measured here on the tiny model (not read from a results file)
    assert abs(out["peak_rss_mib"] - held) <= 0.10 * out["peak_rss_mib"], mem
    json.dumps(out)  # plain JSON


EXACT = {"objective.correction": "on_policy", "advantages.eps": 1e-4, "autocast": "float32",
         "minibatches": 1, "epochs": 1, "advantages.std_normalise": True,
         "advantages.batch_norm": "none", "objective.entropy_coef": 0.0}  # fmt: skip
"""provrl's step as the reference computes it: on-policy GRPO with group-std advantages (the
default preset's Dr. GRPO is another advantage), no entropy bonus (the default preset's is
another term), one optimizer step, TRL's ε, float32 (bf16 autocast rounds the two layouts
differently)."""


@pytest.mark.parametrize(("side", "packing"), [("reference", "trie"), ("reference_plain", "none")])
def test_the_reference_step_is_provrls_grpo_step(small_fixture, side, packing):
    """Same batch, same weights: each reference arm's loss and (clipped) gradients are
    provrl's — the reference is a faithful GRPO step, only laid out differently."""
    import copy

    import torch

    from provrl.models import load_model
    from provrl.train.rl import RLTrainer

    lm = load_model("tiny")
    trajs = load_batch(small_fixture)
    pad = lm.tokenizer.pad_token_id or 0
    ref = ReferenceStep(copy.deepcopy(lm.model), pad, micro=4, plain=REFERENCES[side],
                        autocast="float32")  # fmt: skip
    ref_loss = ref.loss_and_grad(trajs)
    torch.nn.utils.clip_grad_norm_(ref.params, 1.0)
    cfg = _rl_config({**EXACT, "packing": packing, "micro_batch_size": 4})
    trainer = RLTrainer(lm.model, cfg, pad_token_id=pad)
    out = trainer.step(trajs)  # its gradients stay on the parameters after the step
    assert out.metrics["loss"] == pytest.approx(ref_loss, rel=1e-5, abs=1e-7)
    names = [n for n, p in lm.model.named_parameters() if p.requires_grad]
    ours = dict(zip(names, trainer.params, strict=True))
    theirs = dict(zip(names, ref.params, strict=True))
    assert any(float(p.grad.abs().max()) > 0 for p in ours.values())
    for n in names:
        torch.testing.assert_close(ours[n].grad, theirs[n].grad, rtol=1e-4, atol=1e-6, msg=n)


def test_make_fixture_takes_groups_with_signal_first(tmp_path, small_fixture):
    out = tmp_path / "f.jsonl"
    shape = make_fixture(small_fixture, out, groups=1, k=3)
    assert shape["trajectories"] == 3 and shape["groups"] == 1


def test_the_sharing_factor_counts_what_the_trie_computes_once():
    trajs = load_batch()
    one = trajs[:1]
    assert prefix_sharing_factor(one)["factor"] == 1.0
    assert prefix_sharing_factor(one * 3)["factor"] == pytest.approx(3.0)  # the same row 3×
    fixture = prefix_sharing_factor(trajs)
    assert fixture["trie_tokens"] < fixture["tokens"] and fixture["factor"] > 1.0


def test_a_runs_sharing_factor_is_read_from_its_step_records(tmp_path):
    trajs = load_batch()
    rl = tmp_path / "run" / "rl"
    rl.mkdir(parents=True)
    with TrajectoryWriter(rl / "trajectories.jsonl") as w:
        w.write_many(trajs)
    steps = [trajs[:8], trajs[8:24]]
    (rl / "steps.jsonl").write_text("".join(
        json.dumps({"step": s + 1, "trained": [t.traj_id for t in b]}) + "\n"
        for s, b in enumerate(steps)))  # fmt: skip
    out = run_sharing_factors(tmp_path / "run")
    want = [prefix_sharing_factor(b)["factor"] for b in steps]
    assert [x["factor"] for x in out["steps"]] == pytest.approx(want)
    assert out["factor_median"] == pytest.approx(sum(want) / 2)


def test_the_speedup_is_against_the_faster_reference_arm(monkeypatch, small_fixture, tmp_path):
    """The summary (no model run: each side's step time is given)."""
    import provrl.bench.trainer as bench

    step_s = {"provrl": 1.0, "provrl_rows": 2.5, "provrl_one_minibatch": 1.0,
              "reference": 8.0, "reference_plain": 4.0}  # fmt: skip
    forward = 1000.0

    specs = []

    def fake(spec):
        specs.append(spec)
        pinned = spec.pin_allocator  # the memory child's step is slower: it must not be timed
        return {"step_s": step_s[spec.side] * (10 if pinned else 1), "matmul_flops": 1e9,
                "peak_rss_mib": 100.0 if pinned else 50.0, "memory": {"pinned": pinned},
                "trainer_metrics": {"num_forward_tokens": forward}}  # fmt: skip

    monkeypatch.setattr(bench, "_spawn", fake)
    monkeypatch.setattr(bench, "matmul_rate", lambda threads: {"bf16_gflops": 10.0})
    out = bench.run_trainer_benchmark("tiny", str(small_fixture), repeats=1, lag0=False)
    assert out["reference_arm"] == "reference_plain"
    assert out["speedup_vs_reference"] == pytest.approx(4.0)
    assert out["speedup_vs_each_reference"] == pytest.approx(
        {"reference": 8.0, "reference_plain": 4.0}
    )
    assert out["speedup_without_sharing"] == pytest.approx(4.0 / 2.5)
    # per side: the timed children run glibc's allocator as a run does, one memory child pins it
    for side in step_s:
        assert [x.pin_allocator for x in specs if x.side == side] == [False, True]
        assert out["sides"][side]["peak_rss_mib"] == 100.0
        assert out["sides"][side]["memory"] == {"pinned": True}
    shape = batch_shape(load_batch(small_fixture))
    sharing = out["prefix_sharing_factor"]
    assert sharing["fixture_step"] == pytest.approx(shape["tokens"] / forward)
    assert sharing["fixture"] == prefix_sharing_factor(load_batch(small_fixture))["factor"]
