"""Prompts as configuration: the world's wording is byte-identical to every earlier run's
(its tokens must not change), the neutral wording on your own data, Search-R1's prompt as a
named template, a reasoning block, and your own template from a file or a string."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from provrl.env.config import AgentConfig, SearchConfig
from provrl.env.prompts import TEMPLATES, build_messages, instructions
from provrl.env.tasks import PLAIN_KIND, Task
from provrl.models.chat import chat_ids
from provrl.rollout.agent import prompt_ids, tools_identity, world_wording

# the instructions every run before prompt templates used, copied from provrl/env/prompts.py
# at b8cce16 — never edit these two: existing runs' prompt tokens depend on them
OLD_TAG = (
    "Answer the question using the search tool. The documents are about a fictional world, "
    "so you cannot know the answer without searching.\n"
    "To search, write <search>query</search> and wait for the results. "
    "To read a whole document, write <open>document id</open>. "
    "When you know the answer, write <answer>answer</answer> with only the answer inside."
)
OLD_HERMES = (
    "Answer the question using the search tool. The documents are about a fictional world, "
    "so you cannot know the answer without searching.\n"
    "Tools: search(query), open(doc_id), answer(answer). Call one tool per turn as "
    '<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>. '
    'Finish with <tool_call>{"name": "answer", "arguments": {"answer": "..."}}</tool_call>.'
)
SHOT = [{"role": "user", "content": "Question: a?"}, {"role": "assistant", "content": "x"}]
WORLD_TASK = Task("t1", "dev", 1, "lookup", "Who founded Orvane?", "Ada", [], "e1", [], 1)
PLAIN_TASK = dataclasses.replace(WORLD_TASK, tier=0, kind=PLAIN_KIND)


def old_messages(system: str, question: str, shots=()) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": system},
        *[m for s in shots for m in s],
        {"role": "user", "content": f"Question: {question}"},
    ]


@pytest.mark.parametrize(("protocol", "old"), [("tag", OLD_TAG), ("hermes", OLD_HERMES)])
def test_the_world_prompt_is_byte_identical(protocol, old, tokenizer):
    assert instructions(protocol) == old
    a = AgentConfig(protocol=protocol)
    q = "Which city hosted the Varn Prize in 1998?"
    want = old_messages(old, q, [SHOT])
    assert build_messages(q, protocol, [SHOT]) == want
    assert a.instructions(world=True).messages(q, [SHOT]) == want
    # the tokens of an existing run's prompt do not change
    ids = prompt_ids(tokenizer, q, protocol, [SHOT], a.instructions(world=True))
    assert ids == chat_ids(tokenizer, want, add_generation_prompt=True)


def test_auto_speaks_of_the_world_only_on_the_world():
    a, s = AgentConfig(), SearchConfig()
    assert world_wording(WORLD_TASK, s) and not world_wording(PLAIN_TASK, s)
    assert not world_wording(WORLD_TASK, SearchConfig(index="docs.sqlite"))  # your own index
    own = a.instructions(world=False).system
    assert own is not None and "fictional" not in own and "<search>query</search>" in own
    assert a.instructions(world=True).system == OLD_TAG
    assert AgentConfig(prompt="world").instructions(world=False).system == OLD_TAG
    assert AgentConfig(prompt="neutral").instructions(world=True).system == own


def test_search_r1_prompt_is_the_user_turn_as_search_r1_writes_it():
    p = AgentConfig(prompt="search-r1").instructions(world=True)
    q = "who wrote the origin of species?"
    msgs = p.messages(q)
    assert p.system is None and len(msgs) == 1 and msgs[0]["role"] == "user"
    # Search-R1, scripts/data_process/nq_search.py, make_prefix(template_type='base')
    assert msgs[0]["content"] == (
        "Answer the given question. You must conduct reasoning inside <think> and </think> "
        "first every time you get new information. After reasoning, if you find you lack some "
        "knowledge, you can call a search engine by <search> query </search> and it will "
        "return the top searched results between <information> and </information>. You can "
        "search as many times as your want. If you find no further external knowledge needed, "
        "you can directly provide the answer inside <answer> and </answer>, without detailed "
        f"illustrations. For example, <answer> Beijing </answer>. Question: {q}\n"
    )
    with pytest.raises(ValidationError, match="protocol tag"):
        AgentConfig(prompt="search-r1", protocol="hermes")


def test_reasoning_block():
    p = AgentConfig(reasoning=True).instructions(world=True)
    assert p.system is not None and p.system.startswith(OLD_TAG + "\n")
    assert "<think> and </think>" in p.system
    # Search-R1's prompt asks for <think> itself: unchanged
    r1 = AgentConfig(prompt="search-r1")
    assert r1.model_copy(update={"reasoning": True}).instructions(world=True) == r1.instructions(
        world=True
    )


def test_own_template_from_a_string_or_a_file(tmp_path):
    p = AgentConfig(prompt_template="Use the tools on the wiki.\n{tools}{reasoning}")
    sys_turn = p.instructions(world=True).system
    assert sys_turn is not None and sys_turn.startswith("Use the tools on the wiki.\nTo search")
    f = tmp_path / "prompt.txt"
    f.write_text('Reply in JSON {"a": 1}. {tools}\nQ: {question}', encoding="utf-8")
    msgs = AgentConfig(prompt_file=str(f)).instructions(world=True).messages("why?")
    assert msgs == [
        {"role": "user", "content": 'Reply in JSON {"a": 1}. ' + TEMPLATES_TOOLS_TAG + "\nQ: why?"}
    ]


TEMPLATES_TOOLS_TAG = OLD_TAG.split("\n", 1)[1]


def test_bad_templates_are_one_line_naming_them(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("Search {corpus} for {question}", encoding="utf-8")
    with pytest.raises(ValidationError, match=r"bad\.txt: unknown placeholder \{corpus\}"):
        AgentConfig(prompt_file=str(bad))
    with pytest.raises(ValidationError, match=r"missing\.txt: cannot read"):
        AgentConfig(prompt_file=str(tmp_path / "missing.txt"))
    with pytest.raises(ValidationError, match="not both"):
        AgentConfig(prompt_file=str(bad), prompt_template="x")
    with pytest.raises(ValidationError, match="empty"):
        AgentConfig(prompt_template="  ")
    assert set(TEMPLATES) == {"world", "neutral", "search-r1"}


def test_tools_identity_names_a_prompt_other_than_the_default(small_search):
    s = SearchConfig()
    default = tools_identity(small_search, s, AgentConfig())
    assert "prompt" not in default.config  # earlier runs' fingerprints stand
    for a in (AgentConfig(prompt="search-r1"), AgentConfig(reasoning=True)):
        other = tools_identity(small_search, s, a)
        assert other.fingerprint != default.fingerprint and "prompt" in other.config
