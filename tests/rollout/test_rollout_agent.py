"""The agent loop on the real engine with the tiny model: trajectories hold exactly the ids
the engine consumed and produced, with the right masks and stamps."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pytest
import torch

from provrl.engine import EngineConfig, LocalEngine
from provrl.env.build import load_split
from provrl.env.config import AgentConfig, SearchConfig
from provrl.env.oracle import run_oracle
from provrl.env.protocol import Call
from provrl.provenance import Identity
from provrl.rollout.agent import (
    REPEATED,
    AgentEnv,
    ObservationCodec,
    oracle_trajectory,
    run_episode,
    run_tool,
    tool_ran,
    tools_identity,
)
from provrl.train.logprobs import token_logprobs


class Recording:
    """The real engine, with every call's ids written down (a pass-through, not a fake)."""

    def __init__(self, engine):
        self.engine = engine
        self.log: dict[str, list[tuple[str, list[int]]]] = {}

    def submit(self, prompt_ids, params, *, request_id=None):
        self.log.setdefault(request_id, []).append(("in", list(prompt_ids)))
        return self._wrap(request_id, self.engine.submit(prompt_ids, params, request_id=request_id))

    def submit_continue(self, request_id, extra_ids, params):
        self.log[request_id].append(("in", list(extra_ids)))
        return self._wrap(request_id, self.engine.submit_continue(request_id, extra_ids, params))

    def _wrap(self, rid, fut):
        fut.add_done_callback(lambda f: self.log[rid].append(("out", list(f.result().token_ids))))
        return fut

    def release(self, request_id):
        self.engine.release(request_id)

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.fixture(scope="module")
def engine(tiny):
    eng = LocalEngine(tiny, EngineConfig(max_seqs=8, max_context=2048, seed=0))
    yield eng
    eng.close()


def make_env(engine, tiny, search, **agent):
    a = AgentConfig(**{"max_new_tokens": 16, "max_turns": 4, "max_malformed": 5, **agent})
    s = SearchConfig()
    return AgentEnv(
        engine,
        tiny.tokenizer,
        search,
        a,
        s,
        Identity("tiny", tiny.fingerprint),
        tools_identity(search, s, a),
    )


def test_trajectories_are_what_the_engine_saw(engine, tiny, small_world, small_search):
    rec = Recording(engine)
    env = make_env(rec, tiny, small_search)
    tasks = load_split(small_world, "dev")[:6]
    with ThreadPoolExecutor(6) as pool:  # concurrent loops on one engine
        trajs = list(
            pool.map(
                lambda jt: run_episode(env, jt[1], traj_id=f"t{jt[0]}", seed=jt[0]),
                enumerate(tasks),
            )
        )
    for tr in trajs:
        tr.validate()
        ids, act = [], []
        for kind, chunk in rec.log[tr.traj_id]:
            ids += chunk
            act += [kind == "out"] * len(chunk)
        assert tr.token_id.tolist() == ids
        assert tr.is_action.tolist() == act
        assert [s.kind for s in tr.segments][:2] == ["prompt", "action"]
        assert set(s.kind for s in tr.segments[2:]) <= {"observation", "action"}
        assert tr.metrics["num_tokens"] == len(tr) <= env.agent.max_total_tokens
        assert tr.policy.name == "tiny" and tr.tools.fingerprint.startswith("sha256:")
        # the tiny random model never writes a well-formed call: each turn is malformed
        assert tr.metrics["malformed_calls"] == tr.metrics["turns"] == 4
        assert tr.meta["finish"] == "max_turns" and tr.reward == 0.0
        text = tiny.tokenizer.decode(tr.token_id[tr.segments[2].start : tr.segments[2].end])
        assert "<|im_start|>user\n<information>\nError: no tool call found" in text
        assert text.endswith("<|im_start|>assistant\n")


def test_behaviour_logprobs_match_teacher_forcing(engine, tiny, small_world, small_search):
    """Recomputing log π(a_t | h_t) on the trajectory's ids reproduces the engine's
    logprobs: the context the engine sampled from is exactly the recorded one."""
    env = make_env(engine, tiny, small_search)
    t = load_split(small_world, "dev")[0]
    tr = run_episode(env, t, traj_id="lp", seed=3)
    with torch.no_grad():
        ref = token_logprobs(tiny.model, torch.from_numpy(tr.token_id.astype(np.int64))[None])[
            0
        ].numpy()
    np.testing.assert_allclose(ref[tr.is_action], tr.logprob[tr.is_action], atol=2e-4)
    assert (tr.version[tr.is_action] == 0).all() and (tr.kept_mass[tr.is_action] == 1).all()


def test_token_budget_and_turn_limits(engine, tiny, small_world, small_search):
    t = load_split(small_world, "dev")[1]
    env = make_env(engine, tiny, small_search, max_turns=8, max_malformed=2)
    tr = run_episode(env, t, traj_id="mal", seed=1)
    assert tr.meta["finish"] == "malformed" and tr.metrics["malformed_calls"] == 2
    assert tr.metrics["turns"] == 2 and [s.kind for s in tr.segments][-1] == "action"
    env = make_env(
        engine,
        tiny,
        small_search,
        max_total_tokens=260,
        max_turns=8,
        max_new_tokens=40,
        max_malformed=8,
    )
    tr = run_episode(env, t, traj_id="budget", seed=1)
    assert len(tr) <= 260 and tr.meta["finish"] in ("token_budget", "max_turns")
    env = make_env(engine, tiny, small_search, max_turns=1)
    tr = run_episode(env, t, traj_id="one", seed=1)
    assert tr.metrics["turns"] == 1 and [s.kind for s in tr.segments] == ["prompt", "action"]
    with pytest.raises(ValueError, match="leaves no room"):
        run_episode(make_env(engine, tiny, small_search, max_total_tokens=64), t, traj_id="x")


def test_tool_results_and_observation_ids(tiny, small_world, small_search):
    a = AgentConfig(max_observation_tokens=40)
    env = make_env(None, tiny, small_search, max_observation_tokens=40)
    task = load_split(small_world, "dev")[0]
    obs, call = run_tool(env, Call("search", task.oracle[0].query))
    assert call.ok and task.oracle[0].passage.split("#")[0] in obs
    obs2, call2 = run_tool(env, Call("open", "d9999999"))
    assert call2.ok and "No document" in obs2
    codec = ObservationCodec(tiny.tokenizer, a)
    tok = tiny.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    ids, cut = codec.ids(obs, tok.encode("<search>x</search>", add_special_tokens=False))
    text = tok.decode(ids)
    assert cut and text.startswith("<|im_end|>\n<|im_start|>user\n<information>") and " …" in text
    assert len(ids) <= 40 + 20
    ids2, _ = codec.ids("short", [5, im_end])  # the turn already ended with <|im_end|>
    assert tok.decode(ids2) == "\n<|im_start|>user\nshort<|im_end|>\n<|im_start|>assistant\n"


def test_oracle_trajectory_is_a_valid_teacher_trace(tiny, small_world, small_search):
    a = AgentConfig()
    tools = tools_identity(small_search, SearchConfig(), a)
    for t in load_split(small_world, "test")[:20]:
        r = run_oracle(t, small_search, 3)
        tr = oracle_trajectory(t, r, tiny.tokenizer, a, tools, traj_id=t.task_id)
        tr.validate()
        acts = [
            tiny.tokenizer.decode(tr.token_id[s.start : s.end])
            for s in tr.segments
            if s.kind == "action"
        ]
        assert acts == [x for x, _ in r.turns]
        assert acts[-1] == f"<answer>{t.answer}</answer>"
        assert tr.metrics["num_tool_calls"] == t.min_searches and tr.reward == 1.0
        assert (tr.logprob[tr.is_action] == 0).all() and tr.policy.name == "oracle"


@pytest.mark.slow
def test_smollm2_with_worked_examples_searches_the_real_index(small_world, small_search):
    """SmolLM2 with 2 worked examples issues well-formed searches (83 % of samples in the
    measured run); each search's observation holds exactly the backend's results."""
    from provrl.env.config import EnvConfig
    from provrl.env.prompts import format_hits
    from provrl.models import load_model
    from provrl.rollout.setup import worked_examples

    lm = load_model("smollm2-135m")
    eng = LocalEngine(lm, EngineConfig(max_seqs=16, max_context=2048, seed=0))
    a = AgentConfig(shots=2, max_turns=3)
    s = SearchConfig()
    cfg = EnvConfig(agent=a, search=s)
    tasks = [t for t in load_split(small_world, "dev") if t.tier == 1][:8]
    shots = worked_examples(load_split(small_world, "train"), 2, small_search, cfg, set())
    env = AgentEnv(
        eng,
        lm.tokenizer,
        small_search,
        a,
        s,
        Identity(lm.name, lm.fingerprint),
        tools_identity(small_search, s, a),
        shots,
    )
    try:
        with ThreadPoolExecutor(16) as pool:
            trajs = list(
                pool.map(
                    lambda j: run_episode(env, tasks[j % 8], traj_id=f"s{j}", seed=j), range(16)
                )
            )
    finally:
        eng.close()
    searched = [t for t in trajs if t.metrics["num_searches"] > 0]
    assert searched
    for t in searched:
        t.validate()
        call = next(c for c in t.tool_calls if c.name == "search" and c.ok)
        # the result of turn t's call is the observation that opens turn t + 1
        obs_seg = next(g for g in t.segments if g.kind == "observation" and g.turn == call.turn + 1)
        text = lm.tokenizer.decode(t.token_id[obs_seg.start : obs_seg.end])
        assert format_hits(small_search.search(call.arguments, 3)) in text


def test_episode_prompt_follows_the_task(engine, tiny, small_world, small_search):
    """``env.agent.prompt: auto``: the world's wording on a world task, the neutral one on a
    plain question/answer task (docs/env.md, Prompts)."""
    import dataclasses

    from provrl.env.tasks import PLAIN_KIND

    env = make_env(engine, tiny, small_search, max_turns=1)
    t = load_split(small_world, "dev")[0]
    for task, fictional in ((t, True), (dataclasses.replace(t, tier=0, kind=PLAIN_KIND), False)):
        tr = run_episode(env, task, traj_id=f"p-{task.kind}", seed=0)
        prompt = tiny.tokenizer.decode(tr.token_id[: tr.segments[0].end])
        assert ("fictional world" in prompt) is fictional
        assert f"Question: {t.question}" in prompt


def test_an_episode_pays_the_call_cost_of_its_start_version(
    engine, tiny, small_world, small_search
):
    """env.agent.tool_call_cost_warmup: the cost an episode pays follows the version of its
    first action token (the engine's, 0 here) and is recorded in its metrics."""
    env = make_env(engine, tiny, small_search, tool_call_cost=0.1, tool_call_cost_warmup=4)
    tr = run_episode(env, load_split(small_world, "dev")[0], traj_id="w0", seed=0)
    assert int(tr.version[tr.is_action][0]) == engine.version == 0
    assert tr.metrics["tool_call_cost"] == 0.0
    full = run_episode(make_env(engine, tiny, small_search, tool_call_cost=0.1),
                       load_split(small_world, "dev")[0], traj_id="w1", seed=0)  # fmt: skip
    assert "tool_call_cost" not in full.metrics


def test_reward_functions_score_the_episode_and_are_recorded(
    engine, tiny, small_world, small_search
):
    """env.agent.rewards: the weighted sum is the trajectory's reward, each function's score
    is in its metrics, and a TRL reward sees the episode's turns as chat messages."""
    from provrl.env.rewards import register_reward, trl_reward

    seen = []

    def turns(completions, question, **kwargs):
        seen.append((completions[0], question[0], kwargs["completion_ids"][0]))
        return [float(sum(m["role"] == "assistant" for m in completions[0]))]

    register_reward("turns", trl_reward(turns))
    env = make_env(engine, tiny, small_search, rewards=("turns", "format", "outcome"),
                   reward_weights=(0.5, 1.0, 2.0), format_penalty=0.25)  # fmt: skip
    task = load_split(small_world, "dev")[0]
    tr = run_episode(env, task, traj_id="r0", seed=0)
    tr.validate()
    assert tr.metrics["reward/turns"] == tr.metrics["turns"] == 4  # the tiny model: 4 malformed
    assert tr.metrics["reward/format"] == 0.0 and tr.metrics["reward/outcome"] == -0.25
    assert tr.reward == 0.5 * 4 + 0.0 + 2.0 * -0.25
    completion, question, ids = seen[0]
    assert question == task.question
    assert [m["role"] for m in completion] == ["assistant", "user"] * 3 + ["assistant"]
    prompt_len = tr.segments[0].end
    assert ids == tr.token_id[prompt_len:].tolist()


class Scripted:
    """A policy that says the given turns in order (its text is the test's input; the
    environment, the tools and the trajectory bookkeeping under test are the real ones)."""

    version = 0

    def __init__(self, tokenizer, turns):
        self.tok, self.turns = tokenizer, list(turns)

    def _turn(self, rid):
        from concurrent.futures import Future

        from provrl.engine.api import TurnOutput

        ids = self.tok.encode(self.turns.pop(0), add_special_tokens=False)
        zeros = np.zeros(len(ids), np.int32)
        out = TurnOutput(rid, ids, np.zeros(len(ids), np.float32), np.ones(len(ids), np.float32),
                         zeros, zeros, zeros, 0, "stop")  # fmt: skip
        fut: Future = Future()
        fut.set_result(out)
        return fut

    def submit(self, prompt_ids, params, *, request_id=None):
        return self._turn(request_id)

    def submit_continue(self, request_id, extra_ids, params):
        return self._turn(request_id)

    def release(self, request_id):
        pass


@pytest.mark.parametrize("mode", ["run", "note"])
def test_a_repeated_call_is_counted_and_under_note_not_run(tiny, small_world, small_search, mode):
    """env.agent.repeat_calls: the same search again (case and spacing aside) counts in
    num_repeat_calls either way; under note it is not run, the observation says where its
    results are, and it still counts as a call (toward the cap and the cost)."""
    task = load_split(small_world, "dev")[0]
    q = task.oracle[0].query
    turns = [f"<search>{q}</search>", f"<search> {q.upper()}  </search>",
             f"<search>{q} extra</search>", f"<answer>{task.answers[0]}</answer>"]  # fmt: skip
    env = make_env(Scripted(tiny.tokenizer, turns), tiny, small_search, repeat_calls=mode,
                   tool_call_cost=0.1, max_tool_calls=4, max_turns=6)  # fmt: skip
    tr = run_episode(env, task, traj_id=f"rep-{mode}", seed=0)
    calls = tr.tool_calls
    assert [c.name for c in calls] == ["search", "search", "search", "answer"]
    assert tr.metrics["num_repeat_calls"] == 1.0
    assert tr.metrics["num_tool_calls"] == 3.0  # the repeat is a call the agent made
    assert tr.reward == pytest.approx(1 - 0.1 * 3)
    second = tiny.tokenizer.decode(tr.token_id[tr.segments[4].start : tr.segments[4].end])
    first = tiny.tokenizer.decode(tr.token_id[tr.segments[2].start : tr.segments[2].end])
    if mode == "note":
        assert calls[1].error == REPEATED and not tool_ran(calls[1])
        assert "Already searched for" in second and "results are above" in second
    else:
        assert calls[1].ok and tool_ran(calls[1])
        assert second.split("<information>")[1] == first.split("<information>")[1]
    assert calls[2].ok and tool_ran(calls[2])  # a different query runs
    from provrl.rollout.evaluate import summarize

    assert summarize([task], [tr], 1)["repeat_rate"] == 1.0  # the eval report's column


@pytest.mark.parametrize("cost_on", ["all", "after_answer"])
def test_the_call_cost_can_charge_only_the_calls_after_the_answer_was_shown(
    tiny, small_world, small_search, cost_on
):
    """env.agent.tool_call_cost_on: on a two-hop task the first search shows the bridge
    entity, the second the answer, the third is not needed. calls_after_answer counts the
    third either way; after_answer charges it alone, all charges all three."""
    task = next(t for t in load_split(small_world, "dev") if t.tier == 2)
    first, second = (step.query for step in task.oracle)
    turns = [f"<search>{first}</search>", f"<search>{second}</search>",
             f"<search>{second} again</search>", f"<answer>{task.answers[0]}</answer>"]  # fmt: skip
    env = make_env(Scripted(tiny.tokenizer, turns), tiny, small_search, tool_call_cost=0.1,
                   tool_call_cost_on=cost_on, max_tool_calls=4, max_turns=6)  # fmt: skip
    tr = run_episode(env, task, traj_id=f"after-{cost_on}", seed=0)
    assert tr.metrics["num_tool_calls"] == 3.0 and tr.metrics["calls_after_answer"] == 1.0
    assert tr.reward == pytest.approx(1 - 0.1 * (3 if cost_on == "all" else 1))
    from provrl.rollout.evaluate import summarize

    assert summarize([task], [tr], 1)["mean_calls_after_answer_solved"] == 1.0  # the report's
    # a log written before the metric existed: "not measured" (NaN, the report's "–"), not 0
    dropped = ("calls_after_answer", "num_repeat_calls")
    old = replace(tr, metrics={k: v for k, v in tr.metrics.items() if k not in dropped})
    summary = summarize([task], [old], 1)
    assert math.isnan(summary["mean_calls_after_answer_solved"])
    assert math.isnan(summary["repeat_rate"])


def test_calls_after_answer_counts_from_the_first_result_that_holds_an_answer():
    from provrl.rollout.agent import calls_after_answer

    answers = ["Harbor Town", "Harbortown"]
    assert calls_after_answer([], answers) == 0
    assert calls_after_answer(["no", "born in harbortown.", None, "x"], answers) == 2
    assert calls_after_answer(["harbor town", "harbor town"], answers) == 1  # seen at once
    assert calls_after_answer(["Harbor Towns"], answers) == 0  # whole words only
    assert calls_after_answer([None, "nothing"], answers) == 0  # never shown: all were needed


def test_a_default_time_scale_keeps_the_tools_fingerprint(small_search):
    """env.search.latency.time_scale came after runs were probed: at its default (1) it is not
    in the tools identity, so those runs' pools stay fresh; a dilation is named and changes it."""
    a = AgentConfig()
    plain = tools_identity(small_search, SearchConfig(), a)
    assert "time_scale" not in plain.config["latency"]
    slow = SearchConfig()
    slow.latency.time_scale = 13.0
    dilated = tools_identity(small_search, slow, a)
    assert dilated.config["latency"]["time_scale"] == 13.0
    assert dilated.fingerprint != plain.fingerprint
