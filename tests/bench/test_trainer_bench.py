"""`provrl bench trainer`: both sides run the same batch, and the memory breakdown explains the
peak (tiny model on a slice of the shipped fixture; the figures themselves mean nothing)."""

from __future__ import annotations

import json

import pytest

from provrl.bench.trainer import FIXTURE, SideSpec, batch_shape, load_batch, make_fixture, run_side
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


@pytest.mark.parametrize("side", ["provrl", "reference"])
def test_a_side_runs_one_step_and_its_memory_breakdown_adds_up(small_fixture, side):
    out = run_side(SideSpec(side, "tiny", str(small_fixture), 1, {}, count_flops=True))
    shape = batch_shape(load_batch(small_fixture))
    assert out["tokens_per_s"] == pytest.approx(shape["tokens"] / out["step_s"])
    assert out["matmul_flops"] > 0
    mem = out["memory"]
    assert set(PARTS) <= set(mem)
    # the parts held at the peak (the published copy comes after the backward's activations)
    transient = max(mem["activations_mib"] + mem["logits_mib"], mem["published_mib"])
    held = sum(mem[k] for k in PARTS[:4]) + transient
    assert held == pytest.approx(mem["held_at_peak_mib"], abs=0.5)
    # the tiny model's parts are small beside the allocator's fixed ~50-100 MiB of
    # temporaries and arenas, so here the bound is 15 %; the 10 % of issue 22 is checked on
    # the SmolLM2 measurement itself (test_the_recorded_breakdown_explains_the_peak)
    assert abs(out["peak_rss_mib"] - held) <= 0.15 * out["peak_rss_mib"], mem
    json.dumps(out)  # plain JSON


def test_the_recorded_breakdown_explains_the_peak():
    """results/trainer.json (SmolLM2): the parts held at the peak of provrl's step as the
    default preset configures it explain the measured peak RSS to within 10 % (the rows
    variant and the reference leave more unexplained: their larger transients fragment more)."""
    from pathlib import Path

    record = json.loads((Path(__file__).parents[2] / "results" / "trainer.json").read_text())
    for name in ("provrl", "provrl_one_minibatch"):
        side = record["sides"][name]
        mem = side["memory"]
        assert set(PARTS) <= set(mem), name
        assert abs(mem["unexplained_mib"]) <= 0.10 * side["peak_rss_mib"], (name, mem)


def test_make_fixture_takes_groups_with_signal_first(tmp_path, small_fixture):
    out = tmp_path / "f.jsonl"
    shape = make_fixture(small_fixture, out, groups=1, k=3)
    assert shape["trajectories"] == 3 and shape["groups"] == 1
