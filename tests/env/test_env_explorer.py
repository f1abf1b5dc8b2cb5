"""The exploratory teacher (provrl.env.oracle.run_explorer): correct traces, more calls than
the minimal plan, a spread, and the oracle's honesty rule kept."""

from __future__ import annotations

import numpy as np

from provrl.env.build import load_split
from provrl.env.config import ExplorerConfig
from provrl.env.oracle import plan_thought, run_explorer, run_oracle, stated_plan
from provrl.env.search import query_terms


def test_explorer_traces_answer_correctly_with_more_calls_than_the_minimal_plan(
    small_world, small_search
):
    tasks = [t for t in load_split(small_world, "train") if t.tier in (1, 2, 3, 4)][:40]
    cfg = ExplorerConfig()
    calls, minimal, kinds = [], [], set()
    for t in tasks:
        exact = run_oracle(t, small_search, k=3)
        for s in range(2):
            r = run_explorer(t, small_search, 3, cfg=cfg, sample=s, max_calls=6)
            assert r.teacher == "explorer" and r.solved == exact.solved
            if not r.solved:
                continue
            assert r.answer == t.answer  # as correct as the oracle
            assert len(r.calls) <= max(6, len(t.oracle))
            # every plan query is issued, in order, among the extras
            searched = [arg for name, arg in r.calls if name == "search"]
            it = iter(searched)
            assert all(any(q == x for x in it) for q in [st.query for st in t.oracle])
            # a vaguer query uses only words of the exact query it precedes
            for name, arg in r.calls:
                if name == "search" and arg not in [st.query for st in t.oracle] and arg != t.answer:  # fmt: skip
                    assert any(set(query_terms(arg)) <= set(query_terms(st.query)) for st in t.oracle)  # fmt: skip
            kinds.update(name for name, _ in r.calls)
            calls.append(len(r.calls))
            minimal.append(len(t.oracle))
    assert calls, "no task solved"
    assert np.mean(calls) >= 1.5 * np.mean(minimal)  # about twice the minimal calls
    assert len(set(np.array(calls) - np.array(minimal))) >= 3  # with a spread
    assert kinds == {"search", "open"}


def test_explorer_is_deterministic_per_task_and_sample(small_world, small_search):
    t = next(t for t in load_split(small_world, "train") if t.tier == 2)
    a = run_explorer(t, small_search, 3, cfg=ExplorerConfig(), sample=0)
    b = run_explorer(t, small_search, 3, cfg=ExplorerConfig(), sample=0)
    assert a.calls == b.calls
    off = ExplorerConfig(reformulate=0, open_unused=0, confirm=0)
    assert [arg for _, arg in run_explorer(t, small_search, 3, cfg=off).calls] == [
        st.query for st in t.oracle
    ]


def test_the_teachers_own_budget_is_spent_and_the_students_cap_is_the_default(small_world):
    """``env.explorer.max_calls`` bounds the explorer's traces; unset, the student's
    ``env.agent.max_tool_calls`` does (the warm start of configs/default.yaml: 6 and 4)."""
    from provrl.config import load_config
    from provrl.pipeline.run import teacher_traces
    from provrl.run_config import RunConfig

    tasks = [t for t in load_split(small_world, "train") if t.tier == 2][:30]
    base = ["pipeline.teacher=explorer", "env.agent.max_tool_calls=3", "env.agent.tool_call_cost=0.1"]  # fmt: skip

    def calls(*extra: str) -> list[int]:
        cfg = load_config(RunConfig, "quick", [*base, *extra])
        return [int(t.metrics["num_tool_calls"]) for t in teacher_traces(cfg, small_world, tasks)]

    capped, own = calls(), calls("env.explorer.max_calls=6")
    assert capped and max(capped) <= 3
    assert max(own) > 3 and max(own) <= 6
    assert len(own) == len(capped)  # the plan's own searches always run: as many solved


def test_a_reasoning_teacher_says_whether_each_result_answers_the_question(
    small_world, small_search
):
    """With ``reasoning`` (env.agent.reasoning) every teacher turn starts with a <think>
    block and makes the same call as without it; the thought after each exact search names
    what it revealed and says whether that answers the question — the one-hop / two-hop
    decision written out — and the answer's thought says it was found. The first thought is
    the plan: how many searches the question needs."""
    from provrl.env.protocol import Call, parse

    tasks = [t for t in load_split(small_world, "train") if t.tier in (1, 2)][:12]
    for t in tasks:
        for teacher in ("oracle", "explorer"):
            if teacher == "oracle":
                plain, thinking = (run_oracle(t, small_search, 3, reasoning=r) for r in (False, True))  # fmt: skip
            else:
                plain, thinking = (run_explorer(t, small_search, 3, cfg=ExplorerConfig(), reasoning=r) for r in (False, True))  # fmt: skip
            if not thinking.solved:
                continue
            assert thinking.calls == plain.calls and thinking.answer == plain.answer
            texts = [a for a, _ in thinking.turns]
            assert all(a.startswith("<think>") and "</think>\n" in a for a in texts)
            assert [parse(a, "tag") for a in texts] == [parse(a, "tag") for a, _ in plain.turns]
            assert isinstance(parse(texts[-1], "tag"), Call)
            said = " ".join(texts)
            # the plan comes first, once, and its count of searches is the task's hop count
            first = texts[0].split("</think>")[0]
            hops = "one search" if t.tier == 1 else "I need two searches"
            assert hops in first and said.count("The question") == 1
            assert f"The results show {t.oracle[-1].reveals}, which answers the question." in said
            for step in t.oracle[:-1]:  # the bridge of a two-hop task is not the answer
                assert (
                    f"The results show {step.reveals}, which does not answer the question yet."
                    in said
                )


def test_the_stated_plan_is_read_back_from_the_teachers_plan_sentence(small_world):
    """:func:`stated_plan` inverts :func:`plan_thought` (the searches its sentence names are the
    task's hop count, 1 to 6) inside a policy's think and around other text, and says None where
    neither sentence is written."""
    from dataclasses import replace

    task = next(t for t in load_split(small_world, "train") if t.tier == 2)
    for hops in range(1, 7):
        t = replace(task, oracle=[task.oracle[0]] * hops)
        text = f"<think>{plan_thought(t)} I search for the name in the question.</think>\n"
        assert stated_plan(text) == hops
    assert stated_plan("<think>I search for the name in the question.</think>") is None
    assert stated_plan("so I need many searches") is None
