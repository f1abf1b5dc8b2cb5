"""The engine profiler: a smoke run on the tiny model, and the attribution of op time."""

from __future__ import annotations

import json
from dataclasses import dataclass

from provrl.bench.engine_profile import breakdown, kind_of, main, phase_ranges
from provrl.engine import EngineConfig, LocalEngine


@dataclass
class Ev:
    name: str
    self_cpu_time_total: float  # µs, as the profiler reports it
    cpu_parent: Ev | None = None


def test_each_ops_self_time_goes_to_its_innermost_phase_and_kind():
    fwd = Ev("provrl.forward", 5.0)
    matmul = Ev("aten::matmul", 1.0, fwd)
    evs = [fwd, matmul, Ev("aten::mm", 3e6, matmul), Ev("aten::bmm", 2e6, matmul),
           Ev("provrl.sample", 7.0), Ev("aten::exp_", 4e6), Ev("aten::sort", 1e6, None)]  # fmt: skip
    evs[5].cpu_parent = evs[4]
    got = breakdown(evs)
    assert got["forward"] == {"python": 5e-6, "other": 1e-6, "gemm": 3.0, "attention": 2.0}
    assert got["sample"] == {"python": 7e-6, "ops": 4.0} and got["outside"] == {"ops": 1.0}
    assert kind_of("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert kind_of("aten::index_put_") == "kv_write" and kind_of("aten::zeros") == "other"
    assert kind_of("aten::add_") == "norm_rope_act" and kind_of("aten::addmm") == "gemm"
    assert kind_of("aten::topk") == "other" and kind_of("aten::to") == "copy_cast"


def test_phase_ranges_leave_the_engine_as_it_was(tiny):
    import provrl.engine.local as local

    sample = local.sample
    with LocalEngine(tiny, EngineConfig(max_seqs=2, max_context=64)) as eng:
        with phase_ranges(eng):
            assert "_forward" in vars(eng) and local.sample is not sample
        assert "_forward" not in vars(eng) and "plan" not in vars(eng._sched)
    assert local.sample is sample


def test_profile_smoke_on_the_tiny_model(tmp_path):
    s = main(["--out-dir", str(tmp_path), "--model", "tiny", "--episodes", "3",
              "--concurrency", "2", "--dtype", "float32", "--row-limit", "10", "--json",
              "--out", str(tmp_path / "rec.json")])  # fmt: skip
    assert s["steps"] > 0 and s["seconds"]["forward"]["gemm"] > 0
    assert set(s["seconds"]) >= {"plan", "forward", "sample", "apply"}
    assert s["tokens"]["episodes"] == 3 and s["python_s_per_step"] > 0
    assert len(json.loads((tmp_path / "ops.json").read_text())) == 10
    assert "aten::mm" in (tmp_path / "ops.txt").read_text()
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == s["steps"]
    rec = json.loads((tmp_path / "rec.json").read_text())  # the record docs would quote
    assert rec["benchmark"] == "engine_profile" and rec["commit"] and rec["steps"] == s["steps"]
