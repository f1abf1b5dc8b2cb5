"""benchmarks/attribution.py end to end on the tiny model: a trajectory log whose rollouts
span a keep-mode swap, each version's weights as a safetensors file."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from provrl.bench.attribution import main
from provrl.conformance.reference import new_version
from provrl.engine import EngineConfig, LocalEngine
from provrl.models import chat_ids
from provrl.provenance import SamplingParams, TrajectoryBuilder
from provrl.trajlog import TrajectoryWriter


def test_the_table_on_a_mixed_version_log(tiny, tmp_path):
    params = SamplingParams(temperature=0.8, top_k=40, max_new_tokens=4)
    prompt = chat_ids(tiny.tokenizer, [{"role": "user", "content": "Who wrote Hamlet?"}])
    v1 = new_version(tiny, 1, 0.5, 0)
    with LocalEngine(tiny, EngineConfig(max_seqs=4, max_context=128, eos_stops=False)) as e:
        o1 = e.submit(prompt, params).result()
        e.load_weights(v1, 1, "keep")
        o2 = e.submit_continue(o1.request_id, [198], params).result()
    b = TrajectoryBuilder("t0", "task-0", sampling=params)
    b.add_prompt(prompt)
    for o in (o1, o2):
        b.add_actions(o.token_ids, logprob=o.logprob, kept_mass=o.kept_mass,
                      version=o.version, kv_min=o.kv_min, kv_max=o.kv_max, replica=0)  # fmt: skip
        if o is o1:
            b.next_turn()
            b.add_observation([198])
    log = tmp_path / "trajectories.jsonl"
    with TrajectoryWriter(log) as w:
        w.write(b.build(reward=0.0))
    sd0 = {k: v.detach().contiguous() for k, v in tiny.model.state_dict().items() if k != "lm_head.weight"}  # fmt: skip
    save_file(sd0, str(tmp_path / "v0.safetensors"))
    save_file({k: v.contiguous() for k, v in v1.items()}, str(tmp_path / "v1.safetensors"))
    out = tmp_path / "attribution.json"
    r = main(["--trajectories", str(log), "--model", "tiny", "--out", str(out),
              "--weights", f"0={tmp_path / 'v0.safetensors'}",
              "--weights", f"1={tmp_path / 'v1.safetensors'}"])  # fmt: skip
    assert r["trajectories"] == 1 and r["spanning_share"] == 1.0 and r["target_version"] == 1
    assert r["table"]["exact"]["token_abs_err_max"] == 0.0
    assert r["table"]["v_start"]["token_abs_err_max"] > 0.0
    assert r["table_spanning"]["on_policy"]["ess_frac"] == torch.tensor(1.0).item()
    assert out.is_file()

    # --steps: only the trained trajectories, each against its step's π_prox (step s made
    # version s, so s − 1): here step 2 trained t0, so π_θ is version 1 as above
    steps = tmp_path / "steps.jsonl"
    steps.write_text('{"step": 1, "version": 1, "trained": []}\n{"step": 2, "version": 2, "trained": ["t0"]}\n')  # fmt: skip
    r2 = main(["--trajectories", str(log), "--model", "tiny", "--steps", str(steps),
               "--weights", f"0={tmp_path / 'v0.safetensors'}",
               "--weights", f"1={tmp_path / 'v1.safetensors'}"])  # fmt: skip
    assert r2["trajectories"] == 1 and r2["table"] == r["table"]
    steps.write_text('{"step": 1, "version": 1, "trained": ["t0"]}\n')  # π_prox = version 0
    r3 = main(["--trajectories", str(log), "--model", "tiny", "--steps", str(steps),
               "--weights", f"0={tmp_path / 'v0.safetensors'}",
               "--weights", f"1={tmp_path / 'v1.safetensors'}"])  # fmt: skip
    on0, on1 = r3["table"]["on_policy"], r["table"]["on_policy"]  # π_θ is now version 0
    assert on0["token_abs_err_mean"] != on1["token_abs_err_mean"]
